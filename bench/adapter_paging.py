"""Adapter paging throughput: many tenants cycling through few resident slots vs all resident.

Two setups on one process-local model each, run interleaved round by round so they see the
same machine state:

- ``resident``: ``--slots`` tenants (default 8), no paging; each round one fused
  ``forward_backward_many`` + ``clip_grad_and_step_many`` over all of them.
- ``paged``: ``--tenants`` tenants (default 64) with ``enable_paging(max_resident=--slots)``;
  each round walks all tenants in groups of ``--slots``, one fused step per group, so every group
  pages its tenants in and the previous group's out (the worst case for an LRU cache).

Each paged group step is paired with one resident step just before it, so both see the same
machine state (readings on a shared machine swing between seconds). Both count every tenant's
tokens (B * seq per tenant per step). Reported per setup: tokens/s (median over group steps), page-in/page-out count and mean milliseconds, and the share of wall time
spent paging; the summary line has ``paged_vs_resident`` (target >= 0.7). One JSON object per
line.

    python bench/adapter_paging.py                       # tiny model, 64 over 8, host memory
    python bench/adapter_paging.py --mode storage        # paged to a temporary directory
    python bench/adapter_paging.py --model tiny://qwen3.5-25m --rounds 3
    python bench/adapter_paging.py --quick               # 16 over 4, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from peft import LoraConfig  # noqa: E402

from twinkle.model import MultiLoraTransformersModel  # noqa: E402

RANKS = (8, 16, 32)


def _build(model_id: str, names: list[str], device: str, **paging) -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel(model_id, device=device)
    if paging:
        model.enable_paging(**paging)
    for i, name in enumerate(names):
        rank = RANKS[i % len(RANKS)]
        model.add_adapter_to_model(
            name, LoraConfig(r=rank, lora_alpha=32, target_modules="all-linear")
        )
        model.set_optimizer("AdamW", adapter_name=name, lr=1e-4)
    return model


def _batch(vocab: int, rows: int, seq: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab, (rows, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _group_step(model, group, batches) -> float:
    """One fused step for ``group``; returns seconds."""
    started = time.perf_counter()
    model.forward_backward_many({n: {"inputs": batches[n]} for n in group})
    model.clip_grad_and_step_many(group, 1.0)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _round(resident, few, paged, many, slots, batches, times) -> None:
    """Every paged tenant steps once, ``slots`` at a time; each paged group step is paired with
    one step of the resident tenants right before it (the same machine state, under load)."""
    for start in range(0, len(many), slots):
        times["resident"].append(_group_step(resident, few, batches))
        times["paged"].append(_group_step(paged, many[start : start + slots], batches))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny://qwen3")
    parser.add_argument("--tenants", type=int, default=64)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up)")
    parser.add_argument("--mode", choices=("host", "storage"), default="host")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.tenants, args.slots, args.rounds, args.seq = 16, 4, 2, 64

    storage = tempfile.mkdtemp(prefix="twinkle-paging-") if args.mode == "storage" else None
    many = [f"t{i}" for i in range(args.tenants)]
    few = many[: args.slots]
    resident = _build(args.model, few, args.device)
    paged = _build(
        args.model, many, args.device, max_resident=args.slots, mode=args.mode, storage_dir=storage
    )
    vocab = resident.model.get_input_embeddings().weight.shape[0]
    batches = {n: _batch(vocab, args.batch, args.seq, i) for i, n in enumerate(many)}

    times: dict[str, list[float]] = {"resident": [], "paged": []}
    _round(resident, few, paged, many, args.slots, batches, times)  # warm-up: optimizer state
    pager = paged.pager
    base = pager.stats.as_dict()
    times = {"resident": [], "paged": []}
    for _ in range(args.rounds):
        _round(resident, few, paged, many, args.slots, batches, times)
    stats = {k: v - base[k] for k, v in pager.stats.as_dict().items()}

    tokens = args.batch * args.seq
    common = {
        "model": args.model,
        "device": args.device,
        "batch": args.batch,
        "seq": args.seq,
        "ranks": list(RANKS),
        "rounds": args.rounds,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    tps, paging_share = {}, 0.0
    for setup, names in (("resident", few), ("paged", many)):
        seconds = statistics.median(times[setup])  # one fused step of ``slots`` tenants
        tps[setup] = args.slots * tokens / seconds
        row = {
            "setup": setup,
            "tenants": len(names),
            "slots": args.slots,
            "group_step_s": round(seconds, 4),
            "group_steps": len(times[setup]),
            "tokens_per_s": round(tps[setup], 1),
            **common,
        }
        if setup == "paged":
            total = sum(times["paged"])
            paging_share = (stats["page_in_s"] + stats["page_out_s"]) / total
            row.update(
                mode=args.mode,
                page_ins=stats["page_ins"],
                page_outs=stats["page_outs"],
                page_in_ms=round(1000 * stats["page_in_s"] / max(stats["page_ins"], 1), 3),
                page_out_ms=round(1000 * stats["page_out_s"] / max(stats["page_outs"], 1), 3),
                paging_share=round(paging_share, 4),
                paged_host_mb=round(pager.host_bytes / 2**20, 2),
            )
        print(json.dumps(row), flush=True)
    print(
        json.dumps(
            {
                "summary": "adapter_paging",
                "paged_vs_resident": round(tps["paged"] / tps["resident"], 3),
                # Median over the paired steps (each pair saw the same machine state).
                "paired_ratio_median": round(
                    statistics.median(r / p for r, p in zip(times["resident"], times["paged"])), 3
                ),
                # What the page copies alone cost: the ratio if nothing else differed.
                "paging_only_ratio": round(1 - paging_share, 3),
                "target": 0.7,
                **common,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
