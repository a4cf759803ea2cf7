"""tilegemm experts under transformers' tensor / expert parallel plans: two gloo processes on the CPU.

One two-rank run (module fixture) shards the tiny model of every family with each layout of
``tilegemm.transformers.parallel`` and compares, on each rank, the sharded model (stock, then patched with
tilegemm, in the same decode loop) with the whole model run in one process (stock): teacher-forced logits
and greedy tokens. A family whose plan the installed transformers lacks is skipped with the reason.
"""

from __future__ import annotations

import json

import pytest
import torch
from hf_models import FAMILIES, assert_tp_experts_layout

from tilegemm.transformers.parallel import PARALLEL_MODES, parallel_api_problem

WORLD_SIZE = 2
CASES = [(family, mode, "float32") for family in FAMILIES for mode in PARALLEL_MODES]
CASES += [("tiny-qwen3-moe", "ep", "bfloat16"), ("tiny-deepseek-v3", "tp", "bfloat16")]
CASES += [("tiny-deepseek-v3", "ep:all_to_all", "float32")]

pytestmark = pytest.mark.skipif(
    parallel_api_problem() is not None or not torch.distributed.is_gloo_available(),
    reason=f"no transformers parallel API or gloo here: {parallel_api_problem()}",
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """``{"family/mode/dtype": result}`` of each rank (a list), from one two-process run of every case."""
    import torch.multiprocessing as mp
    from dist_worker import worker

    tmp = tmp_path_factory.mktemp("parallel")
    out = str(tmp / "results")
    mp.start_processes(
        worker, args=(WORLD_SIZE, str(tmp / "init"), out, CASES), nprocs=WORLD_SIZE, join=True, start_method="spawn"
    )
    return [json.loads(open(f"{out}.rank{rank}.json").read()) for rank in range(WORLD_SIZE)]


def _result(results, key: str) -> list[dict]:
    ranks = [r[key] for r in results]
    for result in ranks:
        if "error" in result:
            pytest.fail(result["error"])
        if "skip" in result:
            pytest.skip(result["skip"])
    return ranks


@pytest.mark.parametrize("mode", PARALLEL_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_patched_matches_single_process_stock(results, family, mode):
    for rank, r in enumerate(_result(results, f"{family}/{mode}/float32")):
        assert r["experts_implementation"] == "tilegemm"
        assert r["tilegemm_calls"] > 0, "the tilegemm experts function never ran"
        assert r["patched"]["calc_diff"] < 1e-5 and r["patched"]["rel_max_diff"] < 1e-5, (rank, r)
        assert r["patched"]["tokens_equal"], (rank, r)
        assert r["stock"]["tokens_equal"] and r["patched_vs_stock_max_diff"] < 1e-5, (rank, r)


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_parallel_holds_a_slice_and_skips_sentinels(results, family):
    for r in _result(results, f"{family}/ep/float32"):
        local = r["local"]
        assert local["expert_parallel"]
        assert local["num_experts"] * WORLD_SIZE == local["global_gate_up_proj"][0]
        assert local["gate_up_proj"][0] == local["down_proj"][0] == local["num_experts"]
        assert r["routed_num_experts"] == [local["num_experts"]]
        assert r["sentinel_slots"] > 0, "no token of another rank's experts reached this rank"


@pytest.mark.parametrize("family", FAMILIES)
def test_tensor_parallel_experts_follow_the_plan(results, family):
    """Every rank holds every expert, cut along the intermediate dimension or whole as transformers' tp plan says
    (``hf_models.assert_tp_experts_layout``), and no token arrives with a sentinel id."""
    from tilegemm.transformers import presets

    config = presets.PRESETS[family].config()
    for r in _result(results, f"{family}/tp/float32"):
        assert r["sentinel_slots"] == 0, r
        assert_tp_experts_layout(config, r["local"], WORLD_SIZE)


def test_tp_layout_check_tells_cut_from_whole():
    """``assert_tp_experts_layout`` against made-up shards: a plan with ``moe_tp_experts`` takes only the cut layout, a
    plan without experts entries only the whole one, and an experts style it does not know fails."""
    from tilegemm.transformers import presets

    config = presets.PRESETS["tiny-qwen3-moe"].config()
    whole = {"num_experts": 8, "expert_parallel": False, "gate_up_proj": (8, 64, 64), "down_proj": (8, 64, 32)}
    whole.update(global_gate_up_proj=(8, 64, 64), global_down_proj=(8, 64, 32))
    cut = dict(whole, gate_up_proj=(8, 32, 64), down_proj=(8, 64, 16))
    config.base_model_tp_plan = {
        "layers.*.mlp.experts.gate_up_proj": "packed_colwise",
        "layers.*.mlp.experts.down_proj": "rowwise",
        "layers.*.mlp.experts": "moe_tp_experts",
    }
    assert_tp_experts_layout(config, cut, 2)
    with pytest.raises(AssertionError):
        assert_tp_experts_layout(config, whole, 2)
    config.base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.mlp.shared_experts.up_proj": "colwise",
    }
    assert_tp_experts_layout(config, whole, 2)
    with pytest.raises(AssertionError):
        assert_tp_experts_layout(config, cut, 2)
    config.base_model_tp_plan = {"layers.*.mlp.experts": "a_new_style"}
    with pytest.raises(AssertionError, match="does not know"):
        assert_tp_experts_layout(config, whole, 2)


def test_all_to_all_expert_parallel(results):
    """transformers' all-to-all EP: each rank's experts get the pairs routed to them, with local ids."""
    for r in _result(results, "tiny-deepseek-v3/ep:all_to_all/float32"):
        assert r["tilegemm_calls"] > 0 and r["local"]["num_experts"] == 4
        assert r["patched"]["calc_diff"] < 1e-5 and r["patched"]["rel_max_diff"] < 1e-5 and r["patched"]["tokens_equal"]


@pytest.mark.parametrize("key", [f"{f}/{m}/{d}" for f, m, d in CASES if d == "bfloat16"])
def test_bf16_sharded_patched_matches_sharded_stock(results, key):
    """bf16. The unfused experts path keeps transformers' rounding sequence: it equals the sharded stock model bit
    for bit (as in one process on the CPU). The fused op (the default) rounds less often, so it moves the logits by
    bf16 steps: on these hidden-size-64 models, teacher-forced calc_diff against stock of about 1e-5 in one process
    as sharded (tests/hf/test_models.py); bound here at 1e-4. Both differ from one process by the
    rounding of the sum of the ranks' partial outputs, which is the sharding's own."""
    for r in _result(results, key):
        assert r["tilegemm_calls"] > 0
        assert r["unfused_vs_stock_max_diff"] == 0.0, r  # stock's GEMMs round once (hf_models.bf16_gemms_round_once)
        assert r["patched_vs_stock_calc_diff"] < 1e-4, r
        assert r["patched"]["calc_diff"] < 1e-3 and r["stock"]["calc_diff"] < 1e-3, r


def test_plan_problems_are_reasons():
    from tilegemm.transformers import presets
    from tilegemm.transformers.parallel import family_plan, parallel_unavailable_reason

    for family in FAMILIES:
        config = presets.PRESETS[family].config()
        for mode in PARALLEL_MODES:
            assert parallel_unavailable_reason(config, mode, WORLD_SIZE) is None, (family, mode)
        assert "ep_dispatch_experts" in family_plan(config, "ep").values()
    uneven = presets.PRESETS["tiny-mixtral"].config()
    uneven.num_local_experts = 3
    assert "do not split evenly" in parallel_unavailable_reason(uneven, "ep", WORLD_SIZE)
    assert parallel_unavailable_reason(uneven, "tp", WORLD_SIZE) is None
    no_plan = presets.PRESETS["tiny-qwen3-moe"].config()
    no_plan.base_model_ep_plan = None
    assert "base_model_ep_plan" in parallel_unavailable_reason(no_plan, "ep", WORLD_SIZE)
    with pytest.raises(ValueError, match="mode"):
        parallel_unavailable_reason(no_plan, "pp")


def test_distributed_configs():
    from tilegemm.transformers.parallel import make_distributed_config

    tp = make_distributed_config("tp", 2)
    assert (tp.tp_size, tp.ep_size) == (2, 1)
    ep = make_distributed_config("ep", 2, ep_implementation="all_to_all")
    assert (ep.tp_size, ep.ep_size, ep.ep_implementation) == (2, 2, "all_to_all")


def test_dist_check_script_two_ranks(tmp_path):
    """The documented torchrun wrapper, on the CPU with a tiny preset: JSON and markdown, every layout agrees."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cmd = ["bash", str(root / "modeling/transformers/dist_check.sh"), str(tmp_path), "2", "--model", "tiny-mixtral"]
    cmd += ["--device", "cpu", "--prompt-tokens", "8", "--new-tokens", "4", "--repeats", "1"]
    env = {**os.environ, "PY": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "dist_check.json").read_text())
    assert report["meta"]["world_size"] == 2
    layouts = {(r["layout"], r["impl"]) for r in report["rows"]}
    assert layouts == {(layout, impl) for layout in ("1dev", "tp2", "ep2") for impl in ("stock", "patched")}
    for row in report["rows"]:
        assert row["tokens_identical"] and row["calc_diff"] < 1e-5, row
        assert row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0
    assert "| tiny-mixtral (2L) | 1 | ep2 | patched | 2 |" in (tmp_path / "dist_check.md").read_text()
