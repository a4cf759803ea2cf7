"""The rank body of tests/transformers/test_parallel.py: tiny models sharded by transformers' plans over gloo.

Every rank builds each tiny model twice with the same seed: once whole (the single-process stock reference)
and once sharded with :func:`tilegemm.transformers.parallel.distribute_model`. The sharded model runs stock,
then patched with tilegemm, on the same prompt and in the same greedy decode loop; each rank writes its
comparisons to ``<out>.rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

NEW_TOKENS = 5


class RouteRecorder:
    """Wraps what the experts function routes with (``moe_route`` on the unfused path, ``moe_experts`` on the
    fused one) to record what it saw (calls, ids, expert count)."""

    def __init__(self):
        import tilegemm.transformers.custom_ops as custom_ops
        import tilegemm.transformers.experts as experts

        self.original_route = experts.moe_route
        self.original_fused = custom_ops.api.moe_experts
        self.reset()
        experts.moe_route = self.route
        custom_ops.api.moe_experts = self.fused

    def reset(self) -> None:
        """Forget what was recorded."""
        self.calls, self.sentinels, self.num_experts = 0, 0, set()

    def _record(self, top_k_index, num_experts: int) -> None:
        self.calls += 1
        self.num_experts.add(int(num_experts))
        self.sentinels += int(((top_k_index < 0) | (top_k_index >= num_experts)).sum())

    def route(self, top_k_index, num_experts, *args, **kwargs):
        self._record(top_k_index, num_experts)
        return self.original_route(top_k_index, num_experts, *args, **kwargs)

    def fused(self, hidden, top_k_index, top_k_weights, w13, *args, **kwargs):
        self._record(top_k_index, w13.shape[0])
        return self.original_fused(hidden, top_k_index, top_k_weights, w13, *args, **kwargs)


def _run(model, sequence, ids):
    from modeling.transformers import measure

    logits = measure.teacher_forced_logits(model, sequence, sequence.shape[1])
    tokens = measure.generate_greedy(model, ids, NEW_TOKENS).tokens
    return logits, tokens


def _case(family: str, mode: str, world_size: int, dtype: torch.dtype, recorder: RouteRecorder) -> dict:
    from hf_models import build, prompt

    from modeling.transformers import measure
    from tilegemm.transformers import apply_tilegemm_to_model
    from tilegemm.transformers.monkey_patch import experts_modules
    from tilegemm.transformers.parallel import distribute_model, local_experts, parallel_unavailable_reason

    mode, _, ep_implementation = mode.partition(":")
    reference = build(family, dtype=dtype)
    reason = parallel_unavailable_reason(reference.config, mode, world_size)
    if reason is not None:
        return {"skip": reason}
    ids = prompt(batch=2, length=10)
    ref_tokens = measure.generate_greedy(reference, ids, NEW_TOKENS).tokens
    sequence = torch.cat([ids, ref_tokens], dim=1)
    ref_logits = measure.teacher_forced_logits(reference, sequence, sequence.shape[1])
    del reference

    model = distribute_model(build(family, dtype=dtype), mode, world_size, ep_implementation or "auto")
    stock_logits, stock_tokens = _run(model, sequence, ids)
    apply_tilegemm_to_model(model)
    recorder.reset()
    patched_logits, patched_tokens = _run(model, sequence, ids)
    scale = float(ref_logits.abs().max())
    unfused_logits = _run_unfused(model, sequence, ids)[0]
    return {
        "experts_implementation": model.config._experts_implementation,
        "local": local_experts(experts_modules(model)[0]),
        "tilegemm_calls": recorder.calls,
        "sentinel_slots": recorder.sentinels,
        "routed_num_experts": sorted(recorder.num_experts),
        "patched": {
            **measure.compare_logits(patched_logits, ref_logits),
            "rel_max_diff": float((patched_logits - ref_logits).abs().max()) / scale,
            "tokens_equal": bool(torch.equal(patched_tokens, ref_tokens)),
        },
        "stock": {
            **measure.compare_logits(stock_logits, ref_logits),
            "tokens_equal": bool(torch.equal(stock_tokens, ref_tokens)),
        },
        "patched_vs_stock_max_diff": float((patched_logits - stock_logits).abs().max()) / scale,
        "patched_vs_stock_calc_diff": measure.compare_logits(patched_logits, stock_logits)["calc_diff"],
        "unfused_vs_stock_max_diff": float((unfused_logits - stock_logits).abs().max()) / scale,
    }


def _run_unfused(model, sequence, ids):
    """:func:`_run` with the experts' unfused path (the fused ``moe_experts`` op switched off)."""
    import tilegemm.transformers.experts as experts

    fused = experts.fused_activation
    experts.fused_activation = lambda module, hidden_states: None
    try:
        return _run(model, sequence, ids)
    finally:
        experts.fused_activation = fused


def worker(rank: int, world_size: int, init_file: str, out: str, cases: list[tuple[str, str, str]]) -> None:
    """One rank: run every ``(family, mode, dtype name)`` case and write ``<out>.rank<rank>.json``.

    ``mode`` is ``"tp"``, ``"ep"`` or ``"ep:<ep_implementation>"``.
    """
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
    )
    from hf_models import bf16_gemms_round_once

    recorder = RouteRecorder()
    results = {}
    try:
        for family, mode, dtype_name in cases:
            key = f"{family}/{mode}/{dtype_name}"
            try:
                with torch.no_grad(), bf16_gemms_round_once():  # stock's bf16 GEMMs round as on every CPU
                    results[key] = _case(family, mode, world_size, getattr(torch, dtype_name), recorder)
            except Exception:
                results[key] = {"error": traceback.format_exc()[-3000:]}
                raise
    finally:
        with open(f"{out}.rank{rank}.json", "w") as f:
            json.dump(results, f, indent=1)
        dist.destroy_process_group()
