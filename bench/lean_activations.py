"""Leaner activations (``ExecutionOptions.lean_activations``): what a training pass saves for
backward, and what a fused step costs, with and without them, side by side in one process.

Per model: the bytes of the distinct storages autograd keeps for one forward over 8 x 128 tokens
(no adapters; the inputs require grad), then N tenants' fused steps (forward_backward_many +
clip_grad_and_step_many) on two models, plain and lean, interleaved step by step in a rotating
order so the machine's drift hits both. Prints one JSON object per model.

    python bench/lean_activations.py [--models tiny://qwen3.5-25m tiny://qwen3-25m] [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import weakref

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from peft import LoraConfig  # noqa: E402

from twinkle.model import MultiLoraTransformersModel  # noqa: E402

SEQ = 128


def saved_bytes(base: torch.nn.Module, rows: int) -> int:
    """Bytes autograd keeps for backward after one forward of ``rows`` x SEQ tokens."""
    ids = torch.randint(10, 4000, (rows, SEQ), generator=torch.Generator().manual_seed(0))
    embeds = base.get_input_embeddings()(ids).detach().requires_grad_(True)
    packed = []

    def pack(t):
        packed.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = base(inputs_embeds=embeds, use_cache=False)
    alive = {}
    for ref in packed:
        t = ref()
        if t is not None:
            alive[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    del out
    return sum(alive.values())


def build(model_id: str, lean: bool, tenants: int) -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel(model_id, options={"lean_activations": lean})
    for i in range(tenants):
        config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
        model.add_adapter_to_model(f"t{i}", config)
        model.set_optimizer("AdamW", lr=1e-4, adapter_name=f"t{i}")
    return model


def run(model_id: str, tenants: int, batch: int, steps: int) -> dict:
    models = {lean: build(model_id, lean, tenants) for lean in (False, True)}
    saved = {lean: saved_bytes(m.model, 8) for lean, m in models.items()}
    g = torch.Generator().manual_seed(1)
    requests = {}
    for i in range(tenants):
        ids = torch.randint(10, 4000, (batch, SEQ), generator=g)
        requests[f"t{i}"] = {"inputs": {"input_ids": ids, "labels": ids.clone()}}
    names = list(requests)
    times: dict[bool, list[float]] = {False: [], True: []}
    for step in range(steps + 2):
        for lean in (False, True) if step % 2 == 0 else (True, False):
            started = time.perf_counter()
            models[lean].forward_backward_many(requests)
            models[lean].clip_grad_and_step_many(names)
            if step >= 2:  # two warm-up steps
                times[lean].append(time.perf_counter() - started)
    median = {lean: statistics.median(t) for lean, t in times.items()}
    return {
        "bench": "lean_activations",
        "model": model_id,
        "saved_mb_per_1024_tokens": {
            "plain": round(saved[False] / 2**20, 1),
            "lean": round(saved[True] / 2**20, 1),
        },
        "saved_ratio": round(saved[True] / saved[False], 3),
        "tenants": tenants,
        "batch": batch,
        "step_ms_median": {
            "plain": round(median[False] * 1e3, 1),
            "lean": round(median[True] * 1e3, 1),
        },
        "step_time_ratio": round(median[True] / median[False], 4),
        "steps": steps,
        "threads": torch.get_num_threads(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny://qwen3.5-25m", "tiny://qwen3-25m"])
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args(argv)
    for model_id in args.models:
        print(json.dumps(run(model_id, args.tenants, args.batch, args.steps)), flush=True)


if __name__ == "__main__":
    main()
