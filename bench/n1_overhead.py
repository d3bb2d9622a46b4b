"""N=1 per-step time, interleaved: Twinkle's fused step with the old argmax token accuracy
(before), as shipped (amax + gather, after), and a plain PEFT step (bench/_peft_peer.py).

    python bench/n1_overhead.py tiny://qwen3.5-25m 1 20    # model, rows per step, timed rounds
"""

import argparse
import os
import time

import torch
from _peft_peer import PeftPeer
from peft import LoraConfig

from twinkle.model import MultiLoraTransformersModel
from twinkle.model.step import passes
from twinkle.model.step.tensors import IGNORE_INDEX, token_logprobs

new = passes._attach_logprobs


def old(states, logits, attr, chunk_bytes):
    seq = logits.shape[1]
    targets = torch.cat([passes.pad_to(s.batch.targets, seq, IGNORE_INDEX) for s in states]).to(
        logits.device
    )
    logprobs = token_logprobs(logits, targets, chunk_bytes)
    row_hits = None
    if attr == "logprobs":
        hits = (logits.detach().argmax(-1) == targets) & (targets != IGNORE_INDEX)
        row_hits = hits.sum(-1).tolist()
    row = 0
    for state in states:
        rows, state_seq = state.batch.targets.shape
        setattr(state, attr, logprobs[row : row + rows, :state_seq])
        if row_hits is not None:
            state.correct = sum(row_hits[row : row + rows])
        row += rows


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("model_id")
parser.add_argument("rows", type=int, help="rows per step")
parser.add_argument("steps", type=int, help="timed rounds")
cli = parser.parse_args()
model_id, B, steps = cli.model_id, cli.rows, cli.steps
m = MultiLoraTransformersModel(model_id, device="cpu")
cfg = dict(r=16, lora_alpha=32, target_modules="all-linear")
m.add_adapter_to_model("t0", LoraConfig(**cfg))
m.set_optimizer("AdamW", lr=1e-4, adapter_name="t0")
peer = PeftPeer(m.model_dir, {"t0": LoraConfig(**cfg)}, lr=1e-4, fused=True)
ids = torch.randint(10, 4000, (B, 128), generator=torch.Generator().manual_seed(1))
batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


def tw():
    m.forward_backward_many({"t0": {"inputs": batch}})
    m.clip_grad_and_step_many(["t0"])


def before():
    passes._attach_logprobs = old
    try:
        tw()
    finally:
        passes._attach_logprobs = new


modes = {"twinkle_before": before, "twinkle_after": tw, "peft": lambda: peer.step({"t0": batch})}
for _ in range(3):
    for fn in modes.values():
        fn()
t = {k: [] for k in modes}
for _ in range(steps):
    for k, fn in modes.items():
        s = time.perf_counter()
        fn()
        t[k].append(time.perf_counter() - s)
print(
    model_id,
    "B",
    B,
    "load",
    os.getloadavg(),
    {k: (round(min(v) * 1e3, 1), round(sorted(v)[len(v) // 2] * 1e3, 1)) for k, v in t.items()},
    "(best_ms, median_ms)",
)
