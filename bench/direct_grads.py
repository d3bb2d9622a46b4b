"""A/B of the multi-LoRA op's direct weight gradients, in one process, rounds interleaved.

``direct``: the training step's own passes run inside ``direct_weight_grads`` (the default):
the op adds its weight gradients to each tenant's flat gradient buffer itself, with one
``_foreach_add_`` per layer call. ``autograd``: the weights are autograd inputs and every weight
gets its own edge and ``AccumulateGrad`` node (``model.direct_weight_grads = False``).

Each round runs fused and limit (see ``multi_tenant_train.py``) under both settings, so the four
medians see the same machine state. One JSON object per point:

    python bench/direct_grads.py                      # tiny model: 8 x rank 16 and mixed ranks, B=1
    python bench/direct_grads.py --models tiny://qwen3.5-25m --rounds 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import _points
import multi_tenant_train as mtt
import torch

from twinkle.model.memory import keep_freed_memory
from twinkle.model.options import ExecutionOptions


def gradients_equal(model_id: str, ranks: tuple[int, ...]) -> bool:
    """Whether two accumulated fused steps give bit-identical gradients under both settings."""
    grads = {}
    for direct in (True, False):
        model = mtt.MultiLoraTransformersModel(
            model_id, options=ExecutionOptions(direct_weight_grads=direct)
        )
        names = mtt.tenant_names(len(ranks))
        for name, rank in zip(names, ranks):
            mtt.add_tenant(model, name, rank, random_b=True)
        batches = {n: mtt.make_batch(2, 32, seed=i) for i, n in enumerate(names)}
        for _ in range(2):  # accumulate twice
            model.forward_backward_many({n: {"inputs": b} for n, b in batches.items()})
        grads[direct] = [p.grad.clone() for n in names for p in model.tenants[n].params]
    return all(torch.equal(a, b) for a, b in zip(grads[True], grads[False]))


def run_point(model_id: str, ranks: tuple[int, ...], batch: int, rounds: int) -> dict:
    # Two models, identical but for the option (same seeds, same tenants), timed in turns.
    point = mtt.Point(model_id, ranks, batch)
    built = {
        direct: mtt.setup_point(point, ExecutionOptions(direct_weight_grads=direct))
        for direct in (True, False)
    }
    modes = {
        (kind, direct): (
            (lambda m=model, b=batches: mtt.step_fused(m, b))
            if kind == "fused"
            else (lambda m=model, c=concatenated: mtt.step_limit(m, c))
        )
        for direct, (model, batches, concatenated) in built.items()
        for kind in ("fused", "limit")
    }
    times: dict[tuple, list[float]] = {key: [] for key in modes}
    warmup = 3
    for i in range(warmup + rounds):
        keys = list(modes)
        for key in keys[i % 4 :] + keys[: i % 4]:  # rotate the order every round
            start = time.perf_counter()
            modes[key]()
            if i >= warmup:
                times[key].append(time.perf_counter() - start)
    ms = {key: statistics.median(t) * 1e3 for key, t in times.items()}
    return {
        "model": model_id,
        "tenants": len(ranks),
        "batch": batch,
        "ranks": list(ranks),
        "rounds": rounds,
        "fused_ms_direct": round(ms["fused", True], 3),
        "fused_ms_autograd": round(ms["fused", False], 3),
        "limit_ms_direct": round(ms["limit", True], 3),
        "limit_ms_autograd": round(ms["limit", False], 3),
        "fused_direct_vs_autograd": round(ms["fused", False] / ms["fused", True], 3),
        "fused_vs_limit_direct": round(ms["limit", True] / ms["fused", True], 3),
        "fused_vs_limit_autograd": round(ms["limit", False] / ms["fused", False], 3),
        "small_gemm_us": mtt.small_gemm_us()["threads"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=[mtt.MODELS[0]])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    keep_freed_memory()  # as the benchmark and the server run
    print(json.dumps({"gradients_bit_identical": gradients_equal(args.models[0], (8, 16, 32))}))
    for model_id in args.models:
        for ranks in ((_points.RANK,) * 8, _points.MIXED_RANKS):
            print(json.dumps(run_point(model_id, ranks, args.batch, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
