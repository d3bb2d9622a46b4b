"""What the megatron equivalence tests share: two tenants of different ranks trained through the
same fused passes and clipped step on any backend, the comparison with the transformers backend's
run, and the seed's Megatron client flow through an in-process server."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from twinkle.loss.base import Loss, LossOutput

TENANTS = {"a": (4, 1), "b": (8, 2)}  # name: (rank, seed): heterogeneous ranks
MARK = 5  # a token make_batch never draws (it draws 10..3999)


class MarkedNanLoss(Loss):
    """Token-mean cross entropy, NaN on a batch holding a ``MARK`` target: a loss that fails on
    one rank's rows alone. Importable, so spawned worker ranks unpickle it."""

    name = "marked_nan"

    def __call__(self, inputs):
        n = int(inputs.mask.sum())
        loss = -(inputs.logprobs * inputs.mask).sum() / max(n, 1)
        if bool((inputs.target_tokens == MARK).any()):
            loss = loss * float("nan")
        return LossOutput(loss, n, {})


class FailsOnRankLoss(Loss):
    """Token-mean cross entropy that raises on world rank ``rank`` alone (as an out-of-memory
    on one device would): that rank answers at once, its peers go on into the backward's
    collectives and wait there for it."""

    name = "fails_on_rank"

    def __init__(self, rank: int = 1) -> None:
        self.rank = rank

    def __call__(self, inputs):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == self.rank:
            raise MemoryError(f"rank {self.rank} ran out of memory (test)")
        n = int(inputs.mask.sum())
        return LossOutput(-(inputs.logprobs * inputs.mask).sum() / max(n, 1), n, {})


def make_batch(rows, seq, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 4000, (rows, seq), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def train_two_tenants(model, out_dir):
    """Two fused forward_backward + one fused step; the losses, adapters and a saved checkpoint."""
    for name, (r, seed) in TENANTS.items():
        config = {"r": r, "lora_alpha": 2 * r, "target_modules": "all-linear"}
        # B non-zero, so every LoRA weight gets a gradient at the first step.
        model.add_adapter_to_model(name, {**config, "init_lora_weights": False}, seed=seed)
        # eps=1: Adam's first update is lr*g/(|g|+eps), proportional to g; with the default eps
        # it is lr*sign(g), which flips on gradients at rounding level and compares signs only.
        model.set_optimizer("Adam", adapter_name=name, lr=1e-2, eps=1.0)
    # Rows of different lengths, one padded row: per-tenant token normalisation is exercised.
    batch_b = make_batch(2, 10, 2)
    batch_b["attention_mask"][1, 7:] = 0
    batch_b["labels"][1, 7:] = -100
    batches = {"a": {"inputs": make_batch(3, 12, 1)}, "b": {"inputs": batch_b}}
    first = model.forward_backward_many(batches)
    model.clip_grad_and_step_many(list(TENANTS), max_grad_norm=0.5)  # clipping is active
    second = model.forward_backward_many(batches)
    losses = [first[n]["loss"] for n in TENANTS] + [second[n]["loss"] for n in TENANTS]
    states = {n: model.adapter_state_dict(adapter_name=n) for n in TENANTS}
    saved = model.save("ckpt", output_dir=str(out_dir), adapter_name="b")
    return losses, states, saved


EXPERT_TENANTS = {  # name: (rank, target_parameters, seed)
    "e": (4, ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], 1),
    "d": (8, None, 2),  # no expert adapter: its rows share the pass with e's
    "g": (2, ["gate_up_proj"], 3),
}


def train_expert_tenants(model, out_dir, extra: bool = False):
    """The three tenants' fused pass, clipped Adam step and second pass; losses and adapters."""
    for name, (r, params, seed) in EXPERT_TENANTS.items():
        config = {"r": r, "lora_alpha": 2 * r, "init_lora_weights": False}
        if params:
            config["target_parameters"] = params
        model.add_adapter_to_model(name, config, seed=seed)
        model.set_optimizer("Adam", adapter_name=name, lr=1e-2, eps=1.0)
    # 3, 4 and 5 rows: under ep=2 split 2/1, 2/2 and 3/2 (unequal shares of e's and g's loss).
    batches = {n: {"inputs": make_batch(3 + i, 12 - i, i)} for i, n in enumerate(EXPERT_TENANTS)}
    first = model.forward_backward_many(batches)
    model.clip_grad_and_step_many(list(EXPERT_TENANTS), max_grad_norm=0.5)
    second = model.forward_backward_many(batches)
    losses = [first[n]["loss"] for n in EXPERT_TENANTS] + [
        second[n]["loss"] for n in EXPERT_TENANTS
    ]
    if extra:  # one row: under expert parallel fewer rows than ranks, run whole on each
        out = model.forward_backward_many({"e": {"inputs": make_batch(1, 9, 7)}})
        model.clip_grad_and_step_many(["e"], max_grad_norm=0.5)
        losses.append(out["e"]["loss"])
    states = {n: model.adapter_state_dict(adapter_name=n) for n in EXPERT_TENANTS}
    saved = model.save("ckpt", output_dir=str(out_dir), adapter_name="e")
    return losses, states, saved


def assert_expert_run_equal(reference, run):
    """``train_expert_tenants``' results equal the reference's: losses, every adapter tensor
    and the saved checkpoint (keys and values), within 1e-4."""
    (ref_losses, ref_states, ref_dir), (losses, states, saved) = reference, run
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    assert ref_losses[3] != pytest.approx(ref_losses[0], rel=1e-3)  # the step moved "e"
    assert any(".mlp.experts.base_layer.lora_B" in k for k in states["e"])
    for name in EXPERT_TENANTS:
        assert set(states[name]) == set(ref_states[name])
        for key, want in ref_states[name].items():
            assert_rel_close(states[name][key], want)
    files, ref_files = (load_file(f"{d}/adapter_model.safetensors") for d in (saved, ref_dir))
    assert set(files) == set(ref_files)
    for key, want in ref_files.items():
        assert_rel_close(files[key], want)


def assert_rel_close(got, want, rel=1e-4):
    scale = want.abs().max().clamp_min(1e-12)
    assert float((got - want).abs().max() / scale) <= rel


def assert_equals_reference(reference, losses, states, saved):
    ref_losses, ref_states, ref_dir = reference
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    assert ref_losses[2] != pytest.approx(ref_losses[0], rel=1e-3)  # the step moved the adapters
    for name in TENANTS:
        assert set(states[name]) == set(ref_states[name])
        for key, want in ref_states[name].items():
            assert_rel_close(states[name][key], want)
    # One standard PEFT checkpoint (written once, gathered from the ranks): the reference's keys.
    files = load_file(f"{saved}/adapter_model.safetensors")
    ref_files = load_file(f"{ref_dir}/adapter_model.safetensors")
    assert set(files) == set(ref_files)
    for key, want in ref_files.items():
        assert_rel_close(files[key], want)
    config = json.loads(open(f"{saved}/adapter_config.json").read())
    ref_config = json.loads(open(f"{ref_dir}/adapter_config.json").read())
    assert config["r"] == ref_config["r"] == 8
    assert config["target_modules"] == ref_config["target_modules"]


def served_seed_flow(server, route: str, steps: int = 3) -> dict[str, list[float]]:
    """The seed's Megatron client flow (optimizer and scheduler 'default', no set_loss) for two
    tenants of ranks 4 and 8 through ``server``'s model app at ``route``; their losses."""
    from twinkle.server.testing import client

    ids = np.random.default_rng(0).integers(10, 4000, size=(2, 12)).tolist()
    features = [{"input_ids": r, "labels": [-100] * 3 + r[3:]} for r in ids]

    async def post(http, op, **body):
        r = await http.post(f"{route}/{op}", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    async def go():
        losses = {"a": [], "b": []}
        async with client(server) as http:
            for name, r in (("a", 4), ("b", 8)):
                await post(http, "add_adapter_to_model", adapter_name=name, config={"r": r})
                await post(http, "set_optimizer", adapter_name=name, optimizer="default", lr=1e-2)
                await post(
                    http,
                    "set_lr_scheduler",
                    adapter_name=name,
                    scheduler="default",
                    lr_decay_steps=100,
                    max_lr=1e-2,
                )
            for _ in range(steps):
                for name in losses:
                    out = await post(http, "forward_backward", adapter_name=name, inputs=features)
                    losses[name].append(out["result"]["loss"])
                    await post(http, "clip_grad_and_step", adapter_name=name)
        return losses

    return asyncio.run(go())
