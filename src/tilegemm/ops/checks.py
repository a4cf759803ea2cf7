"""Input validation shared by all backends; runs in the dispatch wrapper before any backend.

Errors name the argument, what it got and what it needs: ``TypeError`` for a wrong type or
dtype, ``ValueError`` for shape, device, range and value faults. Nothing is written before
a check fails.

Two kinds of check:

* metadata (types, dtypes, shapes, devices): free, always on;
* values (index ranges, alignment, ``ks_tensor == ks``, MQA windows, block tables): they
  read tensor memory. On CPU tensors they always run (free). On CUDA tensors they cost a host
  sync, so they are off by default and run only with ``TILEGEMM_CHECK_VALUES=1``, never during
  CUDA-graph capture. Inside :func:`skip_value_checks` (internal callers that built the indices
  themselves) they never run.
"""

from __future__ import annotations

import contextlib
import numbers
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from tilegemm.env import CHECK_VALUES, env_flag

FP8 = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float32)
RECIPES = ((1, 128, 128), (1, 1, 128))
BLOCK = 128
M_ALIGNMENT = 128

_local = threading.local()


# --------------------------------------------------------------------------- value-check gate


@contextlib.contextmanager
def skip_value_checks() -> Iterator[None]:
    """Inside this context, value checks (which sync the host) are skipped on this thread."""
    _local.skip = getattr(_local, "skip", 0) + 1
    try:
        yield
    finally:
        _local.skip -= 1


def value_checks_enabled(device: torch.device | None = None) -> bool:
    """True when value checks of tensors on ``device`` should run now (see the module docstring).

    ``None`` or a CPU device: on (unless inside :func:`skip_value_checks`); a meta device: off (no values);
    a CUDA device: ``TILEGEMM_CHECK_VALUES`` (default off), never during CUDA-graph capture.
    """
    if getattr(_local, "skip", 0):
        return False
    if device is None or device.type == "cpu":
        return True
    if device.type == "meta" or not env_flag(CHECK_VALUES, default=False):
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


# --------------------------------------------------------------------------------- primitives


def _ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"Tensor(shape={list(x.shape)}, dtype={x.dtype}, device={x.device})"
    return f"{type(x).__name__} {x!r}"


def _tensor(name: str, x: Any, dtypes: Sequence[torch.dtype], ndim: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: got {_describe(x)}, expected a torch.Tensor")
    if x.dtype not in dtypes:
        need = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: got dtype {x.dtype}, expected {need}")
    if x.dim() != ndim:
        raise ValueError(f"{name}: got a {x.dim()}-D tensor of shape {list(x.shape)}, expected {ndim}-D")
    return x


def _shape(name: str, x: torch.Tensor, expected: Sequence[int], meaning: str) -> None:
    if list(x.shape) != list(expected):
        raise ValueError(f"{name}: got shape {list(x.shape)}, expected {list(expected)} ({meaning})")


def _fp8_operand(name: str, x: Any, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise TypeError(f"{name}: got {_describe(x)}, expected a (float8_e4m3fn data, float32 scales) tuple")
    data = _tensor(f"{name}[0] (data)", x[0], (FP8,), ndim)
    if not isinstance(x[1], torch.Tensor):
        raise TypeError(f"{name}[1] (scales): got {_describe(x[1])}, expected a float32 torch.Tensor")
    if x[1].dtype != torch.float32:
        raise TypeError(f"{name}[1] (scales): got dtype {x[1].dtype}, expected torch.float32")
    return data, x[1]


def _output(name: str, d: Any, dtypes: Sequence[torch.dtype], expected: Sequence[int], meaning: str) -> None:
    _tensor(name, d, dtypes, len(expected))
    _shape(name, d, expected, meaning)
    if not d.is_contiguous():
        raise ValueError(f"{name}: must be contiguous row-major, got strides {list(d.stride())}")


def _same_device(**tensors: Any) -> None:
    devices = {n: t.device for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {dev}" for n, dev in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def _scalar(name: str, x: Any) -> None:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: got {_describe(x)}, expected a real number")


def _int(name: str, x: Any, minimum: int) -> None:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name}: got {_describe(x)}, expected an int")
    if x < minimum:
        raise ValueError(f"{name}: got {x}, expected an int >= {minimum}")


def _bool(name: str, x: Any) -> None:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: got {_describe(x)}, expected a bool")


def _stream(stream: Any) -> None:
    if stream is not None and not isinstance(stream, torch.cuda.Stream):
        raise TypeError(f"stream: got {_describe(stream)}, expected None or a torch.cuda.Stream")


def _addend(c: Any, dtypes: Sequence[torch.dtype], expected: Sequence[int], meaning: str) -> None:
    if c is None:
        return
    _tensor("c", c, dtypes, len(expected))
    _shape("c", c, expected, meaning)


# ----------------------------------------------------------------------------- dense GEMMs

_LAYOUT_DIMS = {  # which dims of a and b hold (M, K) and (N, K)
    "nt": ((0, 1), (0, 1)),
    "nn": ((0, 1), (1, 0)),
    "tn": ((1, 0), (1, 0)),
    "tt": ((1, 0), (0, 1)),
}
_LAYOUT_SHAPES = {
    "nt": ("[M, K]", "[N, K]"),
    "nn": ("[M, K]", "[K, N]"),
    "tn": ("[K, M]", "[K, N]"),
    "tt": ("[K, M]", "[N, K]"),
}


def _mnk(layout: str, a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    (am, ak), (bn, bk) = _LAYOUT_DIMS[layout]
    m, k, n, kb = a.shape[am], a.shape[ak], b.shape[bn], b.shape[bk]
    if k != kb:
        a_shape, b_shape = _LAYOUT_SHAPES[layout]
        raise ValueError(
            f"a and b disagree on K for layout {layout} (a {a_shape}, b {b_shape}): "
            f"a has shape {list(a.shape)} (K={k}), b has shape {list(b.shape)} (K={kb})"
        )
    return m, n, k


def infer_recipe(sb: torch.Tensor, n: int, k: int, recipe: Any, lead: Sequence[int] = ()) -> tuple[int, int, int]:
    """Validate RHS scales ``sb`` (shape ``lead + [.., ceil(K/128)]``) against ``recipe``; return the recipe."""
    kb = _ceil_div(k, BLOCK)
    shapes = {(1, 128, 128): [*lead, _ceil_div(n, BLOCK), kb], (1, 1, 128): [*lead, n, kb]}
    if recipe is not None:
        if not (isinstance(recipe, (tuple, list)) and tuple(recipe) in shapes):
            raise ValueError(f"recipe: got {recipe!r}, expected None, (1, 128, 128) or (1, 1, 128)")
        recipe = tuple(recipe)
        _shape("b[1] (scales)", sb, shapes[recipe], f"recipe {recipe}")
        return recipe
    for candidate, shape in shapes.items():
        if list(sb.shape) == shape:
            return candidate
    raise ValueError(
        f"b[1] (scales): got shape {list(sb.shape)}, expected {shapes[(1, 128, 128)]} (128x128 blocks) "
        f"or {shapes[(1, 1, 128)]} (1x128 rows)"
    )


def dense_gemm_check(layout: str, fp8: bool) -> Callable[..., None]:
    """The check of ``{bf16,fp8}_gemm_<layout>``."""

    def check(a, b, d, c, alpha, beta, stream, recipe=None, disable_ue8m0_cast=False) -> None:
        if fp8:
            a_data, sa = _fp8_operand("a", a, 2)
            b_data, sb = _fp8_operand("b", b, 2)
        else:
            a_data = _tensor("a", a, (torch.bfloat16,), 2)
            b_data = _tensor("b", b, (torch.bfloat16,), 2)
        m, n, k = _mnk(layout, a_data, b_data)
        if fp8:
            _shape("a[1] (scales)", sa, [m, _ceil_div(k, BLOCK)], "[M, ceil(K/128)], 1x128 per row")
            infer_recipe(sb, n, k, recipe)
            _bool("disable_ue8m0_cast", disable_ue8m0_cast)
        _output("d", d, OUT_DTYPES, [m, n], "[M, N]")
        _addend(c, OUT_DTYPES, [m, n], "[M, N]")
        _scalar("alpha", alpha)
        _scalar("beta", beta)
        _stream(stream)
        _same_device(a=a_data, b=b_data, d=d, c=c, **({"a_scales": sa, "b_scales": sb} if fp8 else {}))

    return check


# ---------------------------------------------------------------------- m-grouped contiguous


def _check_m_indices(m_indices: torch.Tensor, m_sum: int, groups: int) -> None:
    _shape("m_indices", m_indices, [m_sum], "[M_sum], one group id per row")
    if not value_checks_enabled(m_indices.device) or m_sum == 0:
        return
    bad = (m_indices < -1) | (m_indices >= groups)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"m_indices: row {row} has group {int(m_indices[row])}, expected -1 or 0..{groups - 1}")
    blocks = _ceil_div(m_sum, M_ALIGNMENT)
    padded = torch.full((blocks * M_ALIGNMENT,), -1, dtype=m_indices.dtype, device=m_indices.device)
    padded[:m_sum] = m_indices
    padded = padded.view(blocks, M_ALIGNMENT)
    owner = padded.amax(dim=1, keepdim=True)  # the block's group, or -1 for an all-padding block
    mixed = ((padded != owner) & (padded != -1)).any(dim=1)
    if bool(mixed.any()):
        blk = int(mixed.nonzero()[0, 0])
        raise ValueError(
            f"m_indices: rows {blk * M_ALIGNMENT}..{min(m_sum, (blk + 1) * M_ALIGNMENT) - 1} mix groups; every "
            f"{M_ALIGNMENT}-row block must hold one group's rows, padded with -1"
        )


def check_group_offsets(offs: torch.Tensor, m_sum: int, groups: int) -> None:
    """psum-layout ``offs``: int32 [G], non-decreasing, within ``0..m_sum`` (the values only when enabled)."""
    _shape("m_indices", offs, [groups], "[G] cumulative group end rows (use_psum_layout=True)")
    if not value_checks_enabled(offs.device) or groups == 0:
        return
    prev = torch.cat([offs.new_zeros(1), offs[:-1]])
    if bool((offs < prev).any()) or bool((offs > m_sum).any()):
        raise ValueError(
            f"m_indices (psum offsets): got {offs.tolist()[:16]}..., expected non-decreasing values in 0..{m_sum}"
        )


def m_grouped_contiguous_check(layout: str, fp8: bool) -> Callable[..., None]:
    """The check of ``m_grouped_{bf16,fp8}_gemm_<layout>_contiguous``."""
    b_meaning = "[G, N, K]" if layout == "nt" else "[G, K, N]"

    def check(a, b, d, m_indices, use_psum_layout, stream, disable_ue8m0_cast=False) -> None:
        if fp8:
            a_data, sa = _fp8_operand("a", a, 2)
            b_data, sb = _fp8_operand("b", b, 3)
        else:
            a_data = _tensor("a", a, (torch.bfloat16,), 2)
            b_data = _tensor("b", b, (torch.bfloat16,), 3)
        m_sum, k = a_data.shape
        groups, n, kb = b_data.shape if layout == "nt" else (b_data.shape[0], b_data.shape[2], b_data.shape[1])
        if k != kb:
            raise ValueError(
                f"a and b disagree on K: a [M_sum, K] has shape {list(a_data.shape)}, "
                f"b {b_meaning} has shape {list(b_data.shape)}"
            )
        if fp8:
            _shape("a[1] (scales)", sa, [m_sum, _ceil_div(k, BLOCK)], "[M_sum, ceil(K/128)]")
            _shape("b[1] (scales)", sb, [groups, _ceil_div(n, BLOCK), _ceil_div(k, BLOCK)], "[G, N/128, K/128]")
            _bool("disable_ue8m0_cast", disable_ue8m0_cast)
        _output("d", d, OUT_DTYPES, [m_sum, n], "[M_sum, N]")
        _bool("use_psum_layout", use_psum_layout)
        _tensor("m_indices", m_indices, (torch.int32,), 1)
        _stream(stream)
        _same_device(a=a_data, b=b_data, d=d, m_indices=m_indices)
        if use_psum_layout:
            check_group_offsets(m_indices, m_sum, groups)
        else:
            _check_m_indices(m_indices, m_sum, groups)

    return check


# -------------------------------------------------------------------------- m-grouped masked


def m_grouped_masked_check(fp8: bool) -> Callable[..., None]:
    """The check of ``m_grouped_{bf16,fp8}_gemm_nt_masked``."""

    def check(a, b, d, masked_m, expected_m, stream, disable_ue8m0_cast=False) -> None:
        if fp8:
            a_data, sa = _fp8_operand("a", a, 3)
            b_data, sb = _fp8_operand("b", b, 3)
        else:
            a_data = _tensor("a", a, (torch.bfloat16,), 3)
            b_data = _tensor("b", b, (torch.bfloat16,), 3)
        groups, m_max, k = a_data.shape
        if b_data.shape[0] != groups or b_data.shape[2] != k:
            raise ValueError(
                f"b: got shape {list(b_data.shape)}, expected [G={groups}, N, K={k}] to match a [G, Mmax, K] "
                f"of shape {list(a_data.shape)}"
            )
        n = b_data.shape[1]
        if fp8:
            _shape("a[1] (scales)", sa, [groups, m_max, _ceil_div(k, BLOCK)], "[G, Mmax, ceil(K/128)]")
            _shape("b[1] (scales)", sb, [groups, _ceil_div(n, BLOCK), _ceil_div(k, BLOCK)], "[G, N/128, K/128]")
            _bool("disable_ue8m0_cast", disable_ue8m0_cast)
        _output("d", d, OUT_DTYPES, [groups, m_max, n], "[G, Mmax, N]")
        _tensor("masked_m", masked_m, (torch.int32,), 1)
        _shape("masked_m", masked_m, [groups], "[G], valid rows per group")
        _int("expected_m", expected_m, 0)
        _stream(stream)
        _same_device(a=a_data, b=b_data, d=d, masked_m=masked_m)
        if value_checks_enabled(masked_m.device) and groups:
            bad = (masked_m < 0) | (masked_m > m_max)
            if bool(bad.any()):
                g = int(bad.nonzero()[0, 0])
                raise ValueError(f"masked_m: group {g} has {int(masked_m[g])} rows, expected 0..Mmax={m_max}")

    return check


# ------------------------------------------------------------------------------- k-grouped


def k_grouped_check(fp8: bool) -> Callable[..., None]:
    """The check of ``k_grouped_{bf16,fp8}_gemm_tn_contiguous``."""

    def check(a, b, d, ks, ks_tensor, c, stream) -> None:
        if fp8:
            a_data, sa = _fp8_operand("a", a, 2)
            b_data, sb = _fp8_operand("b", b, 2)
        else:
            a_data = _tensor("a", a, (torch.bfloat16,), 2)
            b_data = _tensor("b", b, (torch.bfloat16,), 2)
        if not isinstance(ks, (list, tuple)) or any(
            isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in ks
        ):
            raise TypeError(f"ks: got {_describe(ks)}, expected a list of ints (per-group K)")
        if any(x < 0 for x in ks):
            raise ValueError(f"ks: got {list(ks)}, expected every per-group K >= 0")
        if fp8 and any(x % BLOCK for x in ks):
            raise ValueError(f"ks: got {list(ks)}, expected multiples of {BLOCK} for the FP8 op")
        k_sum, m = a_data.shape
        if b_data.shape[0] != k_sum:
            raise ValueError(f"a [K_sum, M] has shape {list(a_data.shape)} but b [K_sum, N] has {list(b_data.shape)}")
        if sum(ks) != k_sum:
            raise ValueError(f"ks: sums to {sum(ks)}, expected K_sum={k_sum} (rows of a and b)")
        n, groups = b_data.shape[1], len(ks)
        if fp8:
            _shape("a[1] (scales)", sa, [k_sum // BLOCK, m], "[K_sum/128, M]")
            _shape("b[1] (scales)", sb, [k_sum // BLOCK, n], "[K_sum/128, N]")
        _output("d", d, (torch.float32,), [groups, m, n], "[G, M, N]")
        _addend(c, (torch.float32,), [groups, m, n], "[G, M, N]")
        _stream(stream)
        _same_device(a=a_data, b=b_data, d=d, c=c, ks_tensor=ks_tensor)
        if ks_tensor is not None:
            _tensor("ks_tensor", ks_tensor, (torch.int32,), 1)
            _shape("ks_tensor", ks_tensor, [groups], "[G], the device mirror of ks")
            if value_checks_enabled(ks_tensor.device) and groups and ks_tensor.cpu().tolist() != list(ks):
                raise ValueError(f"ks_tensor: holds {ks_tensor.cpu().tolist()}, expected ks={list(ks)}")

    return check


# ------------------------------------------------------------------------------ MQA logits


def mqa_logits_check(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, stream) -> None:
    """The check of ``fp8_mqa_logits``."""
    _tensor("q", q, (FP8,), 3)
    kv_data, kv_scale = _fp8_operand("kv", kv, 2)
    s, h, dim = q.shape
    s_kv = kv_data.shape[0]
    _shape("kv[0] (data)", kv_data, [s_kv, dim], f"[S_kv, D={dim}]")
    _tensor("kv[1] (scales)", kv_scale, (torch.float32,), 1)
    _shape("kv[1] (scales)", kv_scale, [s_kv], "[S_kv], one per key")
    _tensor("weights", weights, (torch.float32,), 2)
    _shape("weights", weights, [s, h], "[S, H]")
    for name, x in (("cu_seq_len_k_start", cu_seq_len_k_start), ("cu_seq_len_k_end", cu_seq_len_k_end)):
        _tensor(name, x, (torch.int32,), 1)
        _shape(name, x, [s], "[S], one per query")
    _bool("clean_logits", clean_logits)
    _stream(stream)
    _same_device(q=q, kv=kv_data, kv_scale=kv_scale, weights=weights, ks=cu_seq_len_k_start, ke=cu_seq_len_k_end)
    if value_checks_enabled(cu_seq_len_k_start.device) and s:
        ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
        bad = (ks < 0) | (ks > ke) | (ke > s_kv)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"cu_seq_len_k_start/end: query {i} has window [{int(ks[i])}, {int(ke[i])}), "
                f"expected 0 <= start <= end <= S_kv={s_kv}"
            )


def _context_lens(context_lens: Any, batch: int | None, next_n: int | None) -> None:
    if not isinstance(context_lens, torch.Tensor):
        raise TypeError(f"context_lens: got {_describe(context_lens)}, expected an int32 torch.Tensor")
    if context_lens.dtype != torch.int32:
        raise TypeError(f"context_lens: got dtype {context_lens.dtype}, expected torch.int32")
    if context_lens.dim() not in (1, 2):
        raise ValueError(f"context_lens: got shape {list(context_lens.shape)}, expected [B] or [B, next_n]")
    if batch is not None:
        expected = [batch] if context_lens.dim() == 1 else [batch, next_n]
        _shape("context_lens", context_lens, expected, "[B] or [B, next_n]")


def paged_mqa_metadata_check(context_lens, block_kv, num_sms) -> None:
    """The check of ``get_paged_mqa_logits_metadata``."""
    _context_lens(context_lens, None, None)
    _int("block_kv", block_kv, 1)
    _int("num_sms", num_sms, 1)
    if value_checks_enabled(context_lens.device) and context_lens.numel() and bool((context_lens < 0).any()):
        raise ValueError(f"context_lens: got a negative length (min {int(context_lens.min())}), expected >= 0")


def visible_lengths(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """Keys row ``(b, t)`` sees, as int64 [B, next_n]: ``ctx[b] - next_n + t + 1`` (1-D) or ``ctx[b, t]`` (2-D)."""
    if context_lens.dim() == 2:
        return context_lens.long()
    offsets = torch.arange(next_n, device=context_lens.device) - next_n + 1
    return context_lens.long()[:, None] + offsets[None, :]


def paged_mqa_logits_check(
    q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits, stream
) -> None:
    """The check of ``fp8_paged_mqa_logits``."""
    _tensor("q", q, (FP8,), 4)
    batch, next_n, h, dim = q.shape
    _tensor("kv_cache", kv_cache, (torch.uint8,), 4)
    num_blocks, block_kv = kv_cache.shape[0], kv_cache.shape[1]
    if kv_cache.shape[2] != 1 or kv_cache.shape[3] != dim + 4:
        raise ValueError(
            f"kv_cache: got shape {list(kv_cache.shape)}, expected [num_blocks, block_kv, 1, D + 4 = {dim + 4}]"
        )
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache: must be contiguous (its bytes hold keys then scales per block)")
    _tensor("weights", weights, (torch.float32,), 2)
    _shape("weights", weights, [batch * next_n, h], "[B * next_n, H]")
    _context_lens(context_lens, batch, next_n)
    _tensor("block_table", block_table, (torch.int32,), 2)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: got shape {list(block_table.shape)}, expected [B={batch}, max_blocks]")
    _tensor("schedule_meta", schedule_meta, (torch.int32,), 2)
    if schedule_meta.shape[0] < 2 or schedule_meta.shape[1] != 2:
        raise ValueError(f"schedule_meta: got shape {list(schedule_meta.shape)}, expected [num_sms + 1, 2]")
    _int("max_context_len", max_context_len, 0)
    _bool("clean_logits", clean_logits)
    _stream(stream)
    _same_device(q=q, kv_cache=kv_cache, weights=weights, context_lens=context_lens, block_table=block_table)
    if not value_checks_enabled(block_table.device) or batch == 0:
        return
    visible = visible_lengths(context_lens, next_n)
    longest = int(visible.max())
    if int(context_lens.min()) < 0:
        raise ValueError(f"context_lens: got a negative length (min {int(context_lens.min())}), expected >= 0")
    if longest > max_context_len:
        raise ValueError(f"max_context_len: got {max_context_len}, but a row sees {longest} keys")
    if longest > block_table.shape[1] * block_kv:
        raise ValueError(
            f"block_table: {block_table.shape[1]} blocks of {block_kv} keys cover {block_table.shape[1] * block_kv} "
            f"keys, but a row sees {longest}"
        )
    used_blocks = (visible.max(dim=1).values.clamp(min=0) + block_kv - 1) // block_kv
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    used = cols[None, :] < used_blocks[:, None]
    bad = used & ((block_table < 0) | (block_table >= num_blocks))
    if bool(bad.any()):
        b, col = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"block_table: batch {b} slot {col} holds block {int(block_table[b, col])}, "
            f"expected 0..{num_blocks - 1} (kv_cache has {num_blocks} blocks)"
        )
