"""Train on one long row and report its time and the process's peak memory, as a JSON line.

Usage:
    python tools/long_row.py --model tiny://qwen3-25m-vocab --tokens 16384 --recompute on
    python tools/long_row.py --tokens 4000000      # a row no memory fits: refused before work

Each run is its own process, so ``peak_rss_mb`` (``ru_maxrss``) is this row's peak. A row that
cannot fit prints the refusal (``refused``) instead of a step.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny://qwen3-25m-vocab")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--recompute", choices=("off", "auto", "on"), default="auto")
    parser.add_argument("--linear-logprobs", choices=("on", "off"), default="on")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    import torch
    from peft import LoraConfig

    from twinkle.errors import InvalidArgumentError
    from twinkle.model import MultiLoraTransformersModel

    if args.threads:
        torch.set_num_threads(args.threads)
    options = {
        "activation_recompute": args.recompute,
        "linear_logprobs": args.linear_logprobs == "on",
    }
    model = MultiLoraTransformersModel(args.model, options=options)
    model.add_adapter_to_model("long", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    model.set_optimizer("AdamW", lr=1e-4)
    vocab = model.model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(10, vocab, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :16] = -100
    record = {"model": args.model, "tokens": args.tokens, **options}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    try:
        out = model.forward_backward({"input_ids": ids, "labels": labels})
    except InvalidArgumentError as exc:
        record.update(refused=str(exc), seconds=round(time.perf_counter() - start, 3))
        print(json.dumps(record), flush=True)
        return 0
    model.clip_grad_and_step()
    record.update(
        loss=round(float(out["loss"]), 4),
        seconds=round(time.perf_counter() - start, 1),
        rss_before_step_mb=round(before),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        threads=torch.get_num_threads(),
    )
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
