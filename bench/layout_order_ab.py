"""A/B of the fused step's layout order: tenants packed by (rank, rows, length) or as they came.

Builds one Twinkle model with N tenants at B=1 whose ranks cycle 8/16/32 (the benchmark's
many-tenant mix, requested interleaved), then alternates fused steps with the committed layout
order and with arrival order (``_layout_key`` replaced by a constant), step by step, so the
machine's load hits both alike. Prints one JSON line: tokens/s per order (medians) and their ratio.

    python bench/layout_order_ab.py --model tiny://qwen3.5 --tenants 32 --steps 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny://qwen3.5")
    parser.add_argument("--tenants", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per order")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    import _points
    import multi_tenant_train as mtt
    import torch

    from twinkle.model.step import fused

    if args.threads:
        torch.set_num_threads(args.threads)
    point = mtt.Point(model=args.model, ranks=_points.many_ranks(args.tenants), batch=1)
    _, step = mtt.mode_step(point, "fused")
    orders = {"layout": fused._layout_key, "arrival": lambda batch, tenant: 0}
    times: dict[str, list[float]] = {name: [] for name in orders}
    warmup = 2
    for i in range(warmup + args.steps):
        for name in list(orders)[:: 1 if i % 2 else -1]:  # alternate which goes first
            fused._layout_key = orders[name]
            started = time.perf_counter()
            step()
            if i >= warmup:
                times[name].append(time.perf_counter() - started)
    fused._layout_key = orders["layout"]
    tokens = args.tenants * point.seq
    tps = {name: tokens / statistics.median(t) for name, t in times.items()}
    print(
        json.dumps(
            {
                "model": args.model,
                "tenants": args.tenants,
                "ranks": "cycling 8/16/32",
                "layout_tps": round(tps["layout"], 1),
                "arrival_tps": round(tps["arrival"], 1),
                "layout_vs_arrival": round(tps["layout"] / tps["arrival"], 3),
                "steps": args.steps,
                "threads": torch.get_num_threads(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
