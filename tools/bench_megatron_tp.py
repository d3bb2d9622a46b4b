"""Step time of the megatron backend, tensor parallel 1 vs N, on one machine (CPU gloo or GPUs).

Two tenants (r 8 and 16) train one fused forward_backward + step per iteration; the median of
``--steps`` timed iterations after ``--warmup`` is printed per tp size, as one JSON line each.

    python tools/bench_megatron_tp.py --model tiny://qwen3-25m --tp 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def batch(rows: int, seq: int, seed: int, vocab: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab, (rows, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def measure(model, steps: int, warmup: int, rows: int, seq: int, vocab: int) -> list[float]:
    for name, r in (("a", 8), ("b", 16)):
        config = {"r": r, "lora_alpha": 2 * r, "target_modules": "all-linear"}
        model.add_adapter_to_model(name, config)
        model.set_optimizer("Adam", adapter_name=name, lr=1e-3)
    batches = {n: {"inputs": batch(rows, seq, i, vocab)} for i, n in enumerate("ab")}
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        model.forward_backward_many(batches)
        model.clip_grad_and_step_many(["a", "b"])
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny://qwen3-25m")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4, help="rows per tenant")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()
    os.environ["TWINKLE_MEGATRON_THREADS"] = str(args.threads)
    from twinkle.hub import load_config

    vocab = min(load_config(args.model).vocab_size, 4000)
    for tp in args.tp:
        from twinkle.model.megatron.parallel import ParallelMegatronModel

        kwargs = {"device": args.device} if args.device else {}
        # tp 1 runs in a one-rank spawned worker too, so both sizes pay the same call overheads.
        model = ParallelMegatronModel(args.model, tp_size=tp, **kwargs)
        try:
            times = measure(model, args.steps, args.warmup, args.rows, args.seq, vocab)
        finally:
            model.close()
        print(
            json.dumps(
                {
                    "model": args.model,
                    "tp": tp,
                    "threads_per_rank": args.threads,
                    "rows_per_tenant": args.rows,
                    "seq": args.seq,
                    "step_s_median": round(statistics.median(times), 4),
                    "step_s_min": round(min(times), 4),
                    "steps": len(times),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
