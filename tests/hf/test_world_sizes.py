"""Any world size: tiny models built by ``modeling/transformers/build.py`` sharded over 2 and 4 gloo ranks on the CPU
agree with the whole model in one process (fp32), and DeepSeek-V3 at batch 32 under TP and EP
(``route_check.py``) agrees with one device to fp32 rounding with no routing flip: the regression test of a
sharding defect. Also the pieces that need no process group: the routing-flip report, the builder, the suite's
command lines and its CPU dry run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_models import FAMILIES, assert_tp_experts_layout

from tilegemm.transformers import presets
from tilegemm.transformers.parallel import parallel_api_problem

ROOT = Path(__file__).resolve().parents[2]
#: fp32 logits of a sharded model against the whole model: the ranks' partial sums round in another order
#: (measured 2e-14 on these models); a mis-sliced or misrouted expert moves calc_diff to 1e-3 or more.
FP32_CALC_DIFF = 1e-10

needs_parallel = pytest.mark.skipif(
    parallel_api_problem() is not None or not torch.distributed.is_gloo_available(),
    reason=f"no transformers parallel API or gloo here: {parallel_api_problem()}",
)


def _spawn(tmp_path, world_size: int, families: list[str], route_argv: list[str]) -> list[dict]:
    import torch.multiprocessing as mp
    from world_worker import worker

    out = str(tmp_path / "results")
    args = (world_size, str(tmp_path / "init"), out, families, route_argv)
    mp.start_processes(worker, args=args, nprocs=world_size, join=True, start_method="spawn")
    return [json.loads(Path(f"{out}.rank{rank}.json").read_text()) for rank in range(world_size)]


ROUTE_ARGV = ["--model", "tiny-deepseek-v3", "--dtypes", "fp32", "--batch-size", "32", "--prompt-tokens", "12",
              "--new-tokens", "4", "--decode-tokens", "3", "--out", "unused"]  # fmt: skip


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def world(request, tmp_path_factory):
    """``(world_size, per-rank results)``: every family at 4 ranks (2 ranks: test_parallel.py), the route check at
    both."""
    size = request.param
    families = list(FAMILIES) if size == 4 else []
    return size, _spawn(tmp_path_factory.mktemp(f"world{size}"), size, families, ROUTE_ARGV)


@needs_parallel
def test_deepseek_v3_batch32_fp32_sharded_equals_one_device(world):
    size, ranks = world
    for rank, result in enumerate(ranks):
        assert "error" not in result, result.get("error")
        rows = result["routes"]
        assert {(r["layout"], r["impl"]) for r in rows} == {
            (layout, impl) for layout in ("1dev", f"tp{size}", f"ep{size}") for impl in ("stock", "patched")
        }
        for row in rows:
            assert "error" not in row and "skipped" not in row, row
            assert row["calc_diff"] < FP32_CALC_DIFF and row["tokens_identical"], (rank, row)
            assert row["top1_agreement"] == 1.0, (rank, row)
            routing = row["routing"]
            assert routing["tokens"] == 32 * 16 and routing["routing_layers"] == 2
            assert routing["flipped_tokens"] == 0 and routing["flip_upstream"]["positions"] == 0, (rank, row)
        one_device_stock = next(r for r in rows if r["layout"] == "1dev" and r["impl"] == "stock")
        assert one_device_stock["calc_diff"] == 0.0 and one_device_stock["max_logit_diff"] == 0.0


@needs_parallel
@pytest.mark.parametrize("world", [4], indirect=True, ids=["world4"])  # at 2 ranks: test_parallel.py
@pytest.mark.parametrize("mode", ["tp", "ep"])
@pytest.mark.parametrize("family", FAMILIES)
def test_four_ranks_equal_one_process(world, family, mode):
    size, ranks = world
    for rank, result in enumerate(ranks):
        case = result[f"{family}/{mode}"]
        if "skip" in case:
            pytest.skip(case["skip"])
        for impl in ("stock", "patched"):
            assert case[impl]["calc_diff"] < FP32_CALC_DIFF and case[impl]["tokens_equal"], (rank, impl, case)
        local = case["local"]
        if mode == "ep":
            assert local["expert_parallel"] and local["num_experts"] * 4 == local["global_gate_up_proj"][0]
        else:
            assert_tp_experts_layout(presets.PRESETS[family].config(), local, 4)


# ------------------------------------------------------------------ no process group


def _tiny(name: str = "tiny-deepseek-v3", **kwargs):
    from modeling.transformers.build import build_model

    return build_model(name, dtype=torch.float32, **kwargs)


@torch.no_grad()
def test_build_is_deterministic_and_experts_are_drawn_per_expert():
    from modeling.transformers.build import expert_weight
    from tilegemm.transformers.monkey_patch import experts_modules

    a, b = _tiny(), _tiny()
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert not p.is_meta and torch.equal(p, q), name
    names = {id(m): n for n, m in a.named_modules()}
    module = experts_modules(a)[0]
    w = module.gate_up_proj
    drawn = expert_weight(0, f"{names[id(module)]}.gate_up_proj", 3, tuple(w.shape[1:]), 0.02, w.dtype, "cpu")
    assert torch.equal(w[3], drawn)
    assert 0.015 < float(w.std()) < 0.025  # N(0, initializer_range)
    other = _tiny(seed=1)
    assert not torch.equal(experts_modules(other)[0].gate_up_proj, w)


@torch.no_grad()
def test_route_recorder_sees_every_moe_layer():
    from modeling.transformers.routes import RouteRecorder

    model = _tiny()
    recorder = RouteRecorder(model)
    ids = torch.randint(0, 256, (3, 5), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids)
    routes = recorder.take()
    k = model.config.num_experts_per_tok
    assert len(routes) == 2 and all(r.shape == (15, k) for r in routes)  # 3 layers, the first dense
    assert all(bool((r[:, 1:] > r[:, :-1]).all()) for r in routes)  # sorted distinct ids per token
    recorder.remove()
    model(input_ids=ids)
    assert all(r.numel() == 0 for r in recorder.take())


@torch.no_grad()
def test_route_recorder_sees_the_indexers_key_sets():
    """A DSA model's indexers are recorded beside its routers, in module order, as sets of visible keys: a query
    with fewer visible keys than the top-k holds each visible key once and -1 for the rest."""
    from hf_models import build, prompt

    from modeling.transformers.routes import RouteRecorder, indexers, routers

    model = build("tiny-deepseek-v32")
    recorder = RouteRecorder(model)
    assert len(recorder.modules) == len(routers(model)) + len(indexers(model)) and indexers(model)
    batch, length, k = 2, 9, model.config.index_topk
    model(prompt(batch=batch, length=length))
    keys = [r for r, m in zip(recorder.take(), recorder.modules) if m in indexers(model)]
    for chosen in keys:
        chosen = chosen.view(batch, length, k)
        for s in range(length):
            visible = chosen[:, s][chosen[:, s] >= 0].view(batch, -1)
            assert visible.shape[1] == min(s + 1, k) and bool((visible <= s).all())
            if s < k:  # every visible key, the rest -1
                assert torch.equal(visible, torch.arange(s + 1).expand(batch, -1))
    recorder.remove()


def test_downstream_of_flip_reaches_later_positions_only():
    from modeling.transformers.routes import downstream_of_flip, flips

    ref = [torch.zeros(6, 2, dtype=torch.long), torch.zeros(6, 2, dtype=torch.long)]
    test = [r.clone() for r in ref]
    test[1][4, 0] = 1  # layer 1, sequence 1 position 1 (two sequences of three positions)
    assert downstream_of_flip(flips(ref, test, 2)).tolist() == [[False, False, False], [False, True, True]]


def test_flip_report_groups_positions_downstream_of_a_flip():
    from modeling.transformers.routes import flip_report

    batch, length, kept, k, vocab = 2, 6, 3, 2, 7
    g = torch.Generator().manual_seed(0)
    ref = [torch.arange(k).repeat(batch * length, 1) for _ in range(3)]
    test = [r.clone() for r in ref]
    test[1].view(batch, length, k)[0, 4] = torch.tensor([0, 5])  # sequence 0, position 4, MoE layer 1
    test[2].view(batch, length, k)[0, 1] = torch.tensor([3, 4])  # sequence 0, position 1 (prompt), layer 2
    ref_logits = torch.randn(batch, kept, vocab, generator=g)
    test_logits = ref_logits.clone()
    test_logits[0] += 1.0  # every kept position of sequence 0 is downstream of its position-1 flip
    report = flip_report(ref, test, ref_logits, test_logits)
    assert report["flipped_tokens"] == 2 and report["flipped_sequences"] == 1
    assert report["flips_per_layer"] == [0, 1, 1] and report["first_flip_layer_tokens"] == [0, 1, 1]
    assert report["no_flip_upstream"]["positions"] == kept and report["no_flip_upstream"]["calc_diff"] == 0.0
    assert report["flip_upstream"]["positions"] == kept and report["flip_upstream"]["calc_diff"] > 0
    assert list(report["by_first_flip_layer"]) == [1, 2]  # position 3: from layer 2; 4, 5: layer 1 at position 4
    assert report["by_first_flip_layer"][2]["positions"] == 1 and report["by_first_flip_layer"][1]["positions"] == 2
    with pytest.raises(ValueError, match="routes"):
        flip_report(ref[:2], test, ref_logits, test_logits)


@needs_parallel
def test_heads_that_do_not_split_are_a_reason():
    from tilegemm.transformers import presets
    from tilegemm.transformers.parallel import parallel_unavailable_reason

    config = presets.PRESETS["tiny-qwen3-moe"].config()  # 2 key/value heads
    assert parallel_unavailable_reason(config, "tp", 2) is None
    assert "num_key_value_heads" in parallel_unavailable_reason(config, "tp", 4)
    config.num_key_value_heads = 4
    assert parallel_unavailable_reason(config, "tp", 4) is None
    assert "num_attention_heads" in parallel_unavailable_reason(config, "tp", 8)
    assert parallel_unavailable_reason(presets.PRESETS["deepseek-v3"].config(1), "tp", 8) is None  # attention whole


def _suite(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": sys.executable, "OMP_NUM_THREADS": "1"}
    cmd = ["bash", str(ROOT / "modeling/transformers/dist_suite.sh"), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def test_suite_pieces_follow_the_world_sizes(tmp_path):
    done = _suite("--out", str(tmp_path), "--list", "--world-sizes", "1,2,4")
    assert done.returncode == 0, done.stderr[-2000:]
    names = [line.split(" ")[0] for line in done.stdout.splitlines()]
    assert names[:3] == ["routes_fp32_w4", "routes_bf16_w4", "f64_dsv3"]
    assert names[3:] == ["routes_fp32_w2", "routes_bf16_w2", "f64_qwen3", "speed_w1", "speed_w2", "speed_w4",
                         "deep_w4", "deep_w2"]  # fmt: skip
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert "--nproc-per-node 4" in lines["speed_w4"] and "--skip-1dev" in lines["speed_w4"]
    assert "--skip-1dev" not in lines["speed_w1"] and "deepseek-v3:12" in lines["deep_w2"]
    assert "qwen3-30b-a3b:48,deepseek-v3:5" in lines["speed_w2"] and "stock,patched,fp8" in lines["speed_w2"]
    only = _suite("--out", str(tmp_path), "--list", "--world-sizes", "2", "--part", "speed")
    assert [line.split(" ")[0] for line in only.stdout.splitlines()] == ["speed_w2", "deep_w2"]


@pytest.mark.slow
@needs_parallel
def test_suite_dry_run_four_ranks(tmp_path):
    """The whole suite on the CPU at world size 4 (gloo, tiny DeepSeek-V3): every piece runs, at most 8 files come
    back, and the tables printed last hold the sharded rows."""
    out = tmp_path / "out"
    args = ["--out", str(out), "--work", str(tmp_path / "work"), "--dry-run", "--world-sizes", "4", "--budget", "1500"]
    done = _suite(*args, timeout=1800)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert sorted(p.name for p in out.iterdir()) == ["suite.json", "suite.log", "suite.md"]
    report = json.loads((out / "suite.json").read_text())
    assert [p["name"] for p in report["pieces"]] == ["routes_fp32_w4", "routes_bf16_w4", "f64_dsv3", "f64_qwen3",
                                                     "speed_w4", "deep_w4"]  # fmt: skip
    assert all(p["status"] == "ok" for p in report["pieces"]) and not report["not_run"]
    fp32 = next(p for p in report["pieces"] if p["name"] == "routes_fp32_w4")["result"]["rows"]
    assert {r["layout"] for r in fp32} == {"1dev", "tp4", "ep4"}
    assert all(r["calc_diff"] < FP32_CALC_DIFF and r["tokens_identical"] for r in fp32)
    speed = next(p for p in report["pieces"] if p["name"] == "speed_w4")["result"]
    assert speed["meta"]["world_size"] == 4
    rows = {(r["layout"], r["impl"], r["batch"]) for r in speed["rows"] if "decode_tok_s" in r}
    assert rows == {(lay, impl, b) for lay in ("1dev", "tp4", "ep4") for impl in ("stock", "patched", "fp8")
                    for b in (1, 32)}  # fmt: skip
    table = done.stdout
    assert "| tiny-deepseek-v3 3L | 32 | ep4 |" in table and "| routes_fp32_w4 | ok |" in table


def test_layouts_and_fp8_copies_that_do_not_fit_are_reasons(monkeypatch):
    """dist_check skips what would not fit the device's free memory (read as 1 GiB here) instead of failing."""
    from modeling.transformers import dist_check
    from tilegemm.transformers import presets

    monkeypatch.setattr(dist_check, "_free_bytes", lambda device: 1 << 30)
    dsv3 = presets.PRESETS["deepseek-v3"]
    reason = dist_check._fit_problem(dsv3, 12, torch.bfloat16, 4, "ep", torch.device("cpu"))
    assert reason.startswith("needs ~58 GiB per device")  # 9 MoE layers of 22.5 GB over 4 ranks, the rest whole
    assert "~200 GiB" in dist_check._fit_problem(dsv3, 12, torch.bfloat16, 1, None, torch.device("cpu"))
    monkeypatch.setattr(dist_check, "_free_bytes", lambda device: 1 << 40)
    assert dist_check._fit_problem(dsv3, 12, torch.bfloat16, 4, "ep", torch.device("cpu")) is None
    model = _tiny()
    assert dist_check._fp8_fit_problem(model, torch.device("cpu")) is None
    monkeypatch.setattr(dist_check, "_free_bytes", lambda device: 1 << 20)
    assert "FP8 expert copies need" in dist_check._fp8_fit_problem(model, torch.device("cpu"))


def test_speed_summary_ratios_scaling_and_bound():
    """The suite's speed table on GPU-shaped rows: x stock, x the one-device row, the step profile and its bound."""
    from modeling.transformers.dist_suite import speed_summary

    def row(layout, impl, tok, step, rest, **extra):
        return {"model": "m", "layers": 48, "batch": 32, "layout": layout, "impl": impl, "decode_tok_s": tok,
                "prefill_tok_s": 1000.0, "calc_diff": 1e-4, "graph_step_ms": step, "no_experts_step_ms": rest,
                **extra}  # fmt: skip

    skipped_fp8 = {"model": "m", "layers": 48, "batch": 32, "layout": "1dev", "impl": "fp8", "skipped": "no room"}
    one = {"rows": [row("1dev", "stock", 80.0, 12.0, 7.5), row("1dev", "patched", 100.0, 9.0, 7.5), skipped_fp8]}
    four = {"rows": [row("tp4", "stock", 120.0, 10.0, 8.0), row("tp4", "patched", 150.0, 8.5, 8.0),
                     {"model": "m", "layers": 48, "layout": "ep4", "impl": "-", "skipped": "heads"}]}  # fmt: skip
    lines = speed_summary([one, four])
    assert lines[0] == ("| m 48L | 32 | 1dev | 80 | 100 1.25x | skip | 1.00 | 1.0e-04 / 1.0e-04 | - | "
                        "12.00, 7.50 / 9.00, 7.50 | 1.60 |")  # fmt: skip
    assert "| 120 (1.50x 1dev) | 150 1.25x (1.50x 1dev) | - |" in lines[1] and lines[1].endswith("| 1.25 |")
    assert lines[2] == "| m 48L | - | ep4 | skipped: heads |"
