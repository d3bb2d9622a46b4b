"""The LM head's log-probs at a real vocabulary: tiles of (tokens x vocabulary slice) against
chunks of tokens over the whole vocabulary, and against the materialised logits.

One forward + backward of ``log p(target)`` through a frozen ``[vocab, hidden]`` head (a LoRA
base's), the gradient flowing to the hidden states, as a training pass runs it. Each layout runs
in a fresh process of its own (so its peak resident memory is its own), rounds alternate the
layouts, and one JSON line per reading is printed, then one line of medians with each layout's
time and extra peak over the token-chunk layout's:

- ``tiles``: what the step runs (:class:`twinkle.model.step.linear_logprobs.Tiles` at
  ``ExecutionOptions().linear_chunk_bytes``);
- ``token_chunks``: chunks of tokens, each against the whole vocabulary (128 MiB of logits, the
  layout the step used before tiles);
- ``materialised``: ``[tokens, vocab]`` logits, ``log_softmax`` and gather (what a plain
  Hugging Face loss does).

    python bench/linear_logprobs.py                       # 1,024 and 4,096 tokens, 151,936 vocab
    python bench/linear_logprobs.py --tokens 1024 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

LAYOUTS = ("tiles", "token_chunks", "materialised")
TOKEN_CHUNK_BYTES = 128 << 20


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(layout: str, tokens: int, vocab: int, hidden: int, steps: int, threads: int) -> dict:
    """One layout's reading in this (fresh) process."""
    import torch

    from twinkle.model.options import ExecutionOptions
    from twinkle.model.step import linear_logprobs as ll

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    weight = torch.empty(vocab, hidden).normal_(0, 0.05, generator=g)
    hidden_N_H = torch.randn(tokens, hidden, generator=g)
    targets = torch.randint(0, vocab, (tokens,), generator=g)

    def step() -> float:
        h = hidden_N_H.clone().requires_grad_()
        if layout == "materialised":
            logp = torch.log_softmax((h @ weight.T).float(), dim=-1)
            out = logp.gather(-1, targets[:, None]).squeeze(-1)
        else:
            if layout == "tiles":
                tiles = ll.Tiles.of(tokens, vocab, ExecutionOptions().linear_chunk_bytes)
            else:
                tiles = ll.Tiles(max(1, TOKEN_CHUNK_BYTES // (4 * vocab)), vocab)
            # The autograd function itself: the public entry always takes Tiles.of.
            out = ll._LinearLogprobs.apply(h, weight, targets, tiles, False, None)[0]
        out.sum().backward()
        return float(out.detach().sum())

    before_mb = _status_mb("VmRSS")
    times, value = [], 0.0
    for i in range(steps + 1):
        start = time.perf_counter()
        value = step()
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return {
        "layout": layout,
        "tokens": tokens,
        "vocab": vocab,
        "hidden": hidden,
        "step_s": round(statistics.median(times), 4),
        "peak_over_setup_mb": round(_status_mb("VmHWM") - before_mb, 1),
        "logprob_sum": round(value, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.stdout.write(
            json.dumps(
                child(args.child, args.tokens[0], args.vocab, args.hidden, args.steps, args.threads)
            )
            + "\n"
        )
        return
    for tokens in args.tokens:
        readings: dict[str, list[dict]] = {layout: [] for layout in LAYOUTS}
        for _ in range(args.rounds):
            for layout in LAYOUTS:
                cmd = [sys.executable, __file__, "--child", layout, "--tokens", str(tokens)]
                cmd += ["--vocab", str(args.vocab), "--hidden", str(args.hidden)]
                cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
                line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                reading = json.loads(line.strip().splitlines()[-1])
                readings[layout].append(reading)
                print(json.dumps(reading), flush=True)
        median = {
            layout: {
                "step_s": statistics.median(r["step_s"] for r in rs),
                "peak_over_setup_mb": statistics.median(r["peak_over_setup_mb"] for r in rs),
            }
            for layout, rs in readings.items()
        }
        base = median["token_chunks"]
        print(
            json.dumps(
                {
                    "summary": True,
                    "tokens": tokens,
                    "vocab": args.vocab,
                    "median": median,
                    "time_vs_token_chunks": {
                        k: round(v["step_s"] / base["step_s"], 3) for k, v in median.items()
                    },
                    "peak_vs_token_chunks": {
                        k: round(v["peak_over_setup_mb"] / base["peak_over_setup_mb"], 3)
                        for k, v in median.items()
                    },
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
