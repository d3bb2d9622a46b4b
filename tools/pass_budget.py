"""Measure the fused step's pass budget and the allocator setting on this machine.

Each configuration (``max_pass_tokens`` x ``malloc_tuning``) runs in a fresh process (the
allocator setting is process-wide, and each process's peak RSS is its own); configurations are
interleaved, ``--repeats`` rounds of all of them, so a change in the machine's load hits every
configuration alike. A process builds the model with N tenants (rank 16, ``all-linear``), runs
``--warmup`` fused steps (forward_backward_many + clip_grad_and_step_many) and then ``--steps``
timed ones, and prints one JSON line: tokens/s (every tenant's tokens) and peak RSS.

    python tools/pass_budget.py --model tiny://qwen3.5-25m --tenants 8 --batch 4 \\
        --budgets 0 1024 2048 --malloc 1 0 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SEQ = 128


def peak_rss_mb() -> float:
    """The process's resident-set high-water mark (Linux ``VmHWM``), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def child(args: argparse.Namespace) -> None:
    import torch
    from peft import LoraConfig

    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.memory import heap_stats

    torch.manual_seed(0)
    options = {"max_pass_tokens": args.budget, "malloc_tuning": bool(args.malloc_on)}
    model = MultiLoraTransformersModel(args.model, device="cpu", options=options)
    names = [f"t{i}" for i in range(args.tenants)]
    for name in names:
        model.add_adapter_to_model(
            name, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
        )
        model.set_optimizer("AdamW", lr=1e-4, adapter_name=name)
    g = torch.Generator().manual_seed(1)
    requests = {}
    for name in names:
        ids = torch.randint(10, 4000, (args.batch, SEQ), generator=g)
        requests[name] = {"inputs": {"input_ids": ids, "labels": ids.clone()}}
    times = []
    for step in range(args.warmup + args.steps):
        started = time.perf_counter()
        model.forward_backward_many(requests)
        model.clip_grad_and_step_many(names)
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    tokens = args.tenants * args.batch * SEQ
    best = min(times)
    print(
        json.dumps(
            {
                "model": args.model,
                "tenants": args.tenants,
                "batch": args.batch,
                "max_pass_tokens": args.budget,
                "malloc_tuning": bool(args.malloc_on),
                "tok_s_best": round(tokens / best, 1),
                "tok_s_median": round(tokens / sorted(times)[len(times) // 2], 1),
                "peak_rss_mb": peak_rss_mb(),
                # glibc's heaps after the run: in use against freed-but-kept (fragmentation).
                "heap_mb": {k: round(v / 2**20) for k, v in (heap_stats() or {}).items()},
                "threads": torch.get_num_threads(),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny://qwen3.5-25m")
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--budgets", type=int, nargs="+", default=[0, 1024])
    parser.add_argument("--malloc", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--malloc-on", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps({"load_avg": os.getloadavg(), "cpus": os.cpu_count()}), flush=True)
    for _ in range(args.repeats):
        for budget in args.budgets:
            for malloc in args.malloc:
                command = [sys.executable, __file__, "--child", "--budget", str(budget)]
                command += ["--malloc-on", str(malloc), "--model", args.model]
                command += ["--tenants", str(args.tenants), "--batch", str(args.batch)]
                command += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
                out = subprocess.run(command, capture_output=True, text=True, check=True)
                print(out.stdout.strip().splitlines()[-1], flush=True)
    print(json.dumps({"load_avg": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
