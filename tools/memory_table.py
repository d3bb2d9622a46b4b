"""Activation memory of a training pass at real model shapes: the formula's table and its check.

Usage:
    python tools/memory_table.py                 # the table for real shapes (formula only)
    python tools/memory_table.py --measure       # + saved bytes per token measured on CPU

The table uses :class:`twinkle.model.step.plan.ModelShape` (the pass budget's own memory model)
for real model shapes on 80 GB and 141 GB GPUs: bytes per token, tokens per fused pass (half the
memory left after the bf16 weights, as the GPU pass budget takes it) and the longest row one pass
can train (all of that memory), for the materialised logits without recompute (what earlier
releases kept), logits-free log-probs, and logits-free with decoder-layer recompute.

``--measure`` runs one training pass per mode on tiny models with the real vocabularies and
counts the bytes the autograd graph keeps for the backward (distinct storages, weights excluded),
per token, beside the formula's figure. One JSON line per measurement, then the markdown tables.
"""

from __future__ import annotations

import argparse
import json
import sys

from twinkle.model.options import ExecutionOptions
from twinkle.model.step.plan import GPU_FREE_FRACTION, ModelShape, head_chunk_bytes

GIB = 1 << 30
#: (name, hidden, decoder layers, vocabulary, parameters in billions); bf16 weights.
REAL_SHAPES = (
    ("Qwen3.5-4B-like (the seeds' model)", 2560, 36, 248_320, 4.5),
    ("Qwen3-8B", 4096, 36, 151_936, 8.2),
    ("Qwen3.5-27B", 5120, 64, 248_320, 27.0),
)
GPUS = (("80 GB", 80e9), ("141 GB", 141e9))
MODES = (
    ("materialised", dict(logits_free=False, recompute=False)),
    ("logits-free", dict(logits_free=True, recompute=False)),
    ("logits-free + recompute", dict(logits_free=True, recompute=True)),
)
#: What the memory takes besides weights and activations (CUDA context, allocator slack,
#: adapters and their optimizer states of a few tenants).
OVERHEAD_BYTES = 4 * GIB
CHUNK_BYTES = ExecutionOptions().linear_chunk_bytes


def table() -> list[str]:
    lines = [
        "| model (hidden x layers, vocab) | mode | MB / token | tokens / pass, 80 GB | longest row, 80 GB | tokens / pass, 141 GB | longest row, 141 GB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, hidden, layers, vocab, billions in REAL_SHAPES:
        shape = ModelShape(hidden=hidden, layers=layers, vocab=vocab, dtype_bytes=2)
        for mode, flags in MODES:
            per_token = shape.bytes_per_token(**flags)
            fixed = head_chunk_bytes(CHUNK_BYTES, 2) if flags["logits_free"] else 0
            cells = [f"{name} ({hidden} x {layers}, {vocab:,})", mode, f"{per_token / 1e6:.2f}"]
            for _, memory in GPUS:
                free = memory - billions * 1e9 * 2 - OVERHEAD_BYTES
                cells.append(f"{int((free * GPU_FREE_FRACTION - fixed) // per_token):,}")
                cells.append(f"{int((free - fixed) // per_token):,}")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def measure(model_ids: list[str], tokens: int) -> list[dict]:
    """Saved bytes per token of one training pass per mode, against the formula."""
    import torch
    from peft import LoraConfig

    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.step.loss import loss_of
    from twinkle.model.step.passes import forward_batches

    records = []
    for model_id in model_ids:
        for mode, flags in MODES:
            options = {
                "linear_logprobs": flags["logits_free"],
                # the switch exists either way; this pass turns it on or leaves it off
                "activation_recompute": "on" if flags["recompute"] else "auto",
            }
            model = MultiLoraTransformersModel(model_id, options=options)
            model.add_adapter_to_model("a", LoraConfig(r=8, lora_alpha=16))
            vocab = model.model.get_input_embeddings().weight.shape[0]
            ids = torch.randint(10, vocab, (1, tokens), generator=torch.Generator().manual_seed(0))
            batch = model._collate(model.tenant("a"), {"input_ids": ids, "labels": ids.clone()}, {})
            weights = {p.untyped_storage().data_ptr() for p in model.model.parameters()}
            storages: dict[int, int] = {}

            def pack(t, storages=storages, weights=weights):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in weights:
                    storages[ptr] = t.untyped_storage().nbytes()
                return t

            with (
                model.recompute.enabled(flags["recompute"]),
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            ):
                (state,) = forward_batches(
                    model.model,
                    model.router,
                    model.device,
                    [batch],
                    [loss_of(batch, model.tenant("a"))],
                    grad=True,
                    options=model.options,
                )
            saved = sum(storages.values())
            state.logprobs.sum().backward()
            shape = ModelShape.of(model.model)
            records.append(
                {
                    "model": model_id,
                    "mode": mode,
                    "tokens": tokens,
                    "saved_bytes_per_token": round(saved / tokens),
                    "formula_bytes_per_token": shape.bytes_per_token(**flags),
                }
            )
            print(json.dumps(records[-1]), flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="also measure on CPU")
    parser.add_argument(
        "--models",
        nargs="*",
        default=["tiny://qwen3-vocab", "tiny://qwen3-25m-vocab", "tiny://qwen3.5-25m-vocab"],
    )
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args(argv)
    if args.measure:
        records = measure(args.models, args.tokens)
        print()
        print("| model | mode | measured bytes / token | formula | formula / measured |")
        print("|---|---|---|---|---|")
        for r in records:
            ratio = r["formula_bytes_per_token"] / max(1, r["saved_bytes_per_token"])
            print(
                f"| {r['model']} | {r['mode']} | {r['saved_bytes_per_token']:,} | "
                f"{r['formula_bytes_per_token']:,} | {ratio:.2f} |"
            )
        print()
    print("\n".join(table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
