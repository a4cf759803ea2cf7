"""The rank body of tests/hf/test_world_sizes.py: tiny models built by ``modeling/transformers/build.py``,
whole and sharded over ``world_size`` gloo ranks, and ``route_check.py``'s rows at that world size."""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

#: Key/value heads that split over 2 and 4 tensor-parallel ranks (the tiny presets have 2).
HEADS = {"num_key_value_heads": 4}


def _family_case(family: str, mode: str, world_size: int) -> dict:
    from hf_models import prompt

    from modeling.transformers import measure
    from modeling.transformers.build import build_model
    from tilegemm.transformers import apply_tilegemm_to_model
    from tilegemm.transformers.monkey_patch import experts_modules
    from tilegemm.transformers.parallel import local_experts, parallel_unavailable_reason

    reference = build_model(family, dtype=torch.float32, **HEADS)
    reason = parallel_unavailable_reason(reference.config, mode, world_size)
    if reason is not None:
        return {"skip": reason}
    ids = prompt(batch=2, length=10)
    ref_tokens = measure.generate_greedy(reference, ids, 4).tokens
    sequence = torch.cat([ids, ref_tokens], dim=1)
    ref_logits = measure.teacher_forced_logits(reference, sequence, sequence.shape[1])
    del reference
    model = build_model(family, dtype=torch.float32, mode=mode, world_size=world_size, **HEADS)
    out = {"local": local_experts(experts_modules(model)[0])}
    for impl in ("stock", "patched"):
        if impl == "patched":
            apply_tilegemm_to_model(model)
        logits = measure.teacher_forced_logits(model, sequence, sequence.shape[1])
        tokens = measure.generate_greedy(model, ids, 4).tokens
        same = bool(torch.equal(tokens, ref_tokens))
        out[impl] = {**measure.compare_logits(logits, ref_logits), "tokens_equal": same}
    return out


def worker(rank: int, world_size: int, init_file: str, out: str, families: list[str], route_argv: list[str]) -> None:
    """One rank: each family under ``tp`` and ``ep``, then ``route_check.run`` with ``route_argv``; writes
    ``<out>.rank<rank>.json``."""
    from modeling.transformers import route_check

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size, timeout=timedelta(seconds=300)
    )
    results: dict = {}
    try:
        with torch.no_grad():
            for family in families:
                for mode in ("tp", "ep"):
                    results[f"{family}/{mode}"] = _family_case(family, mode, world_size)
            if route_argv:
                args = route_check.parse(route_argv)
                results["routes"] = route_check.run(args, world_size, torch.device("cpu"))
    except Exception:
        results["error"] = traceback.format_exc()[-3000:]
        raise
    finally:
        with open(f"{out}.rank{rank}.json", "w") as f:
            json.dump(results, f, indent=1, default=str)
        dist.destroy_process_group()
