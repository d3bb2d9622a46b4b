"""Micro-benchmark: frozen base linear vs base + Triton segmented multi-LoRA, forward + backward.

Prints one JSON line per configuration: 4096 tokens, hidden in {1024, 4096}, 8 segments with ranks
cycling 8/16/32/64, bf16. ``base_ms`` times ``y = x @ W.T`` (W frozen) forward + backward (dx);
``lora_ms`` times ``y = x @ W.T + segmented_lora_triton(x, ...)`` forward + backward (dx, dA, dB);
``ratio = lora_ms / base_ms`` (target: <= 1.15). ``reference_ms`` is the same with the torch reference.

Without CUDA it prints ``{"device": "cpu", "skipped": true, ...}`` and exits 0.

    python bench/lora_kernel.py [--tokens 4096] [--iters 50]
"""

import argparse
import json
import sys

import torch


def _time_ms(fn, iters: int, warmup: int = 10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def _bench(hidden: int, tokens: int, n_segments: int, iters: int, dtype: torch.dtype) -> dict:
    from twinkle.model.lora.ops import LoraSegment, segmented_lora_reference
    from twinkle.model.lora.triton_kernel import segmented_lora_triton

    dev = torch.device("cuda")
    ranks = [(8, 16, 32, 64)[i % 4] for i in range(n_segments)]
    w = (torch.randn(hidden, hidden, device=dev) / hidden**0.5).to(dtype)  # frozen base weight
    x = torch.randn(tokens, hidden, device=dev, dtype=dtype, requires_grad=True)
    bounds = [round(i * tokens / n_segments) for i in range(n_segments + 1)]
    segs = []
    for k, r in enumerate(ranks):
        a = (torch.randn(r, hidden, device=dev) / hidden**0.5).to(dtype).requires_grad_()
        b = (torch.randn(hidden, r, device=dev) / r**0.5).to(dtype).requires_grad_()
        segs.append(LoraSegment(bounds[k], bounds[k + 1], a, b, 2.0))
    grad = torch.randn(tokens, hidden, device=dev, dtype=dtype)
    params = [x] + [p for s in segs for p in (s.lora_A, s.lora_B)]

    def base():
        y = torch.nn.functional.linear(x, w)
        y.backward(grad)
        x.grad = None

    def with_lora(fn):
        def step():
            y = torch.nn.functional.linear(x, w) + fn(x, segs, hidden)
            y.backward(grad)
            for p in params:
                p.grad = None

        return step

    base_ms = _time_ms(base, iters)
    lora_ms = _time_ms(with_lora(segmented_lora_triton), iters)
    ref_ms = _time_ms(with_lora(segmented_lora_reference), iters)
    return {
        "device": torch.cuda.get_device_name(),
        "dtype": str(dtype).removeprefix("torch."),
        "tokens": tokens,
        "hidden": hidden,
        "segments": n_segments,
        "ranks": ranks,
        "base_ms": round(base_ms, 4),
        "lora_ms": round(lora_ms, 4),
        "reference_ms": round(ref_ms, 4),
        "ratio": round(lora_ms / base_ms, 4),
        "reference_ratio": round(ref_ms / base_ms, 4),
        "target_ratio": 1.15,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            json.dumps(
                {
                    "device": "cpu",
                    "skipped": True,
                    "reason": "the Triton multi-LoRA benchmark needs CUDA",
                }
            )
        )
        return 0
    from twinkle.model.lora.triton_kernel import triton_available

    if not triton_available():
        print(json.dumps({"device": "cuda", "skipped": True, "reason": "triton is not installed"}))
        return 0
    for hidden in (1024, 4096):
        print(
            json.dumps(_bench(hidden, args.tokens, args.segments, args.iters, torch.bfloat16)),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
