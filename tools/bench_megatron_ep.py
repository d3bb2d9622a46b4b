"""Step time of the megatron backend on an MoE model, expert parallel 1 vs N (CPU gloo or GPUs).

Same workload as ``bench_megatron_tp.py`` (two tenants, r 8 and 16, one fused forward_backward +
step per iteration, attention LoRA: the experts carry none); both sizes run in spawned workers.
The ep ranks are megatron's data-parallel ranks: each runs its share of the rows (``rows_run``:
the rows each rank's base model ran, warmup included). Prints one JSON line per ep size with the
median step time and the expert weights each rank holds.

    python tools/bench_megatron_ep.py --model tiny://qwen3-moe --ep 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from bench_megatron_tp import measure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny://qwen3-moe")
    parser.add_argument("--ep", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4, help="rows per tenant")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--max-pass-tokens",
        type=int,
        default=None,
        help="ExecutionOptions.max_pass_tokens (ep > 1 always runs one pass per call)",
    )
    args = parser.parse_args()
    os.environ["TWINKLE_MEGATRON_THREADS"] = str(args.threads)
    from twinkle.hub import load_config
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    config = load_config(args.model)
    vocab = min(config.vocab_size, 4000)
    per_expert = 3 * config.hidden_size * config.moe_intermediate_size
    for ep in args.ep:
        kwargs = {"device": args.device} if args.device else {}
        if args.max_pass_tokens is not None:
            kwargs["options"] = {"max_pass_tokens": args.max_pass_tokens}
        model = ParallelMegatronModel(args.model, tp_size=1, ep_size=ep, **kwargs)
        try:
            times = measure(model, args.steps, args.warmup, args.rows, args.seq, vocab)
            computed = getattr(model, "computed_rows", None)
            rows_run = [rows for rows, _ in computed()] if computed else None
        finally:
            model.close()
        local = config.num_experts // ep
        print(
            json.dumps(
                {
                    "model": args.model,
                    "ep": ep,
                    "threads_per_rank": args.threads,
                    "rows_per_tenant": args.rows,
                    "seq": args.seq,
                    "max_pass_tokens": 0 if ep > 1 else args.max_pass_tokens,
                    "rows_run": rows_run,
                    "experts_per_rank": local,
                    "expert_params_per_rank": config.num_hidden_layers * local * per_expert,
                    "step_s_median": round(statistics.median(times), 4),
                    "step_s_min": round(min(times), 4),
                    "steps": len(times),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
