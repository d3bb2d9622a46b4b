"""Split a fused step's time into its two calls, for several tenant sets on ONE model.

Where a fused step falls short of ``limit`` (one adapter over every row), this tells whether the
gap is in the pass (``forward_backward_many``) or in the optimizer (``clip_grad_and_step_many``,
whose work grows with the tenants' total adapter size, which ``limit`` does not pay). The sets
run interleaved, step by step, on one model, so they share the base weights and the machine's
state; medians after the warm-up steps are printed as one JSON line per set.

    python bench/step_split.py --model tiny://qwen3.5-25m \\
        --set mixed=8,16,32,64 --set r16=16,16,16,16 --set limit=30x4

``NAME=r1,r2,...`` is one tenant per rank, each with ``--batch`` rows; ``NAME=RxK`` is ONE
tenant of rank R with K times ``--batch`` rows (the ``limit`` of K tenants). Adapters, optimizer
and rows are the training benchmark's own (``bench/multi_tenant_train.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def parse_set(text: str) -> tuple[str, list[tuple[int, int]]]:
    """``NAME=8,16`` -> (NAME, [(8, 1), (16, 1)]); ``NAME=30x4`` -> (NAME, [(30, 4)])."""
    name, _, spec = text.partition("=")
    if not name or not spec:
        raise argparse.ArgumentTypeError(f"expected NAME=r1,r2,... or NAME=RxK, got {text!r}")
    if "x" in spec:
        rank, rows = spec.split("x")
        return name, [(int(rank), int(rows))]
    return name, [(int(r), 1) for r in spec.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny://qwen3.5-25m")
    parser.add_argument("--set", dest="sets", type=parse_set, action="append", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import multi_tenant_train as mtt
    import torch

    from twinkle.model import MultiLoraTransformersModel

    torch.manual_seed(0)
    model = MultiLoraTransformersModel(args.model, device="cpu")
    sets: dict[str, tuple[list[tuple[int, int]], list[str], dict]] = {}
    seed = 0
    for set_name, tenants in args.sets:
        names, requests = [], {}
        for i, (rank, rows) in enumerate(tenants):
            name = f"{set_name}{i}"
            mtt.add_tenant(model, name, rank)
            requests[name] = {"inputs": mtt.make_batch(rows * args.batch, mtt.SEQ, seed)}
            names.append(name)
            seed += 1
        sets[set_name] = (tenants, names, requests)
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in sets}
    for step in range(args.warmup + args.steps):
        for set_name, (_, names, requests) in sets.items():
            started = time.perf_counter()
            model.forward_backward_many(requests)
            passed = time.perf_counter()
            model.clip_grad_and_step_many(names)
            done = time.perf_counter()
            if step >= args.warmup:
                times[set_name][0].append(passed - started)
                times[set_name][1].append(done - passed)
    for set_name, (passes, steps) in times.items():
        line = {
            "set": set_name,
            "model": args.model,
            "tenants": [list(t) for t in sets[set_name][0]],
            "forward_backward_ms": round(statistics.median(passes) * 1e3, 1),
            "optimizer_ms": round(statistics.median(steps) * 1e3, 1),
            "steps": args.steps,
            "threads": torch.get_num_threads(),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
