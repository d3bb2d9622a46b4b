"""Tensor parallel megatron (tp=2, two gloo ranks) equals the transformers backend, fp32 on CPU."""

import json

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from twinkle.hub import load_config  # noqa: E402
from twinkle.model.megatron import _build  # noqa: E402

TENANTS = {"a": (4, 1), "b": (8, 2)}  # name: (rank, seed): heterogeneous ranks


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


def assert_rel_close(got, want, rel=1e-4):
    scale = want.abs().max().clamp_min(1e-12)
    assert float((got - want).abs().max() / scale) <= rel


@pytest.mark.slow
def test_tp2_equals_the_transformers_backend(tmp_path):
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    ref_losses, ref_states, ref_dir = train_two_tenants(
        MultiLoraTransformersModel("tiny://qwen3"), tmp_path / "hf"
    )
    with ParallelMegatronModel("tiny://qwen3", tp_size=2) as tp2:
        losses, states, saved = train_two_tenants(tp2, tmp_path / "tp2")
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    assert ref_losses[2] != pytest.approx(ref_losses[0], rel=1e-3)  # the step moved the adapters
    for name in TENANTS:
        assert set(states[name]) == set(ref_states[name])
        for key, want in ref_states[name].items():
            assert_rel_close(states[name][key], want)
    # One standard PEFT checkpoint, written by rank 0: the transformers backend's keys and config.
    files = load_file(f"{saved}/adapter_model.safetensors")
    ref_files = load_file(f"{ref_dir}/adapter_model.safetensors")
    assert set(files) == set(ref_files)
    for key, want in ref_files.items():
        assert_rel_close(files[key], want)
    config = json.loads(open(f"{saved}/adapter_config.json").read())
    ref_config = json.loads(open(f"{ref_dir}/adapter_config.json").read())
    assert config["r"] == ref_config["r"] == 8
    assert config["target_modules"] == ref_config["target_modules"]


def test_tp_size_must_divide_the_model_shapes():
    config = load_config("tiny://qwen3")  # 4 heads, 2 query groups
    _build.check_tp(config, "tiny://qwen3", 2)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        _build.check_tp(config, "tiny://qwen3", 4)
    with pytest.raises(ValueError, match="tp_size must be >= 1"):
        _build.check_tp(config, "tiny://qwen3", 0)


def test_load_shards_hf_weights_the_way_megatron_splits_them():
    # The tp shards, put back together, are the tp=1 layout: column splits output rows (fc1 per
    # half), row splits input columns.
    w = torch.arange(24.0).reshape(4, 6)
    halves = [_build.tp_shard(w, 1, 2, r) for r in range(2)]
    assert torch.equal(torch.cat(halves, 1), w)
    assert _build._split_dim("decoder.layers.0.self_attention.linear_qkv.weight") == 0
    assert _build._split_dim("decoder.layers.0.mlp.linear_fc2.weight") == 1
    assert _build._split_dim("decoder.layers.0.input_layernorm.weight") is None
    with pytest.raises(ValueError, match="does not divide"):
        _build.tp_shard(torch.zeros(3, 2), 0, 2, 0)


@pytest.mark.slow
def test_served_tp2_model_trains_two_tenants(tmp_path):
    """``device_mesh.tp_size: 2`` through the in-process server: the seed's Megatron client flow
    (optimizer and scheduler 'default', no set_loss) for two tenants of different ranks."""
    import asyncio
    import sys
    from pathlib import Path

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
    from inprocess import client, local_server

    from twinkle.model.megatron.parallel import ParallelMegatronModel

    server = local_server(
        tmp_path,
        backend="megatron",
        device_group={"name": "model", "ranks": 2, "device_type": "cpu"},
        device_mesh={"device_type": "cpu", "tp_size": 2},
    )
    route = "/api/v1/model/tiny/qwen3"
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
            for _ in range(3):
                for name in losses:
                    out = await post(http, "forward_backward", adapter_name=name, inputs=features)
                    losses[name].append(out["result"]["loss"])
                    await post(http, "clip_grad_and_step", adapter_name=name)
        return losses

    try:
        losses = asyncio.run(go())
        model = server.services["model"].model
        assert isinstance(model, ParallelMegatronModel) and model.tp_size == 2
    finally:
        server.services["model"].model.close()
    for name in losses:
        assert losses[name][-1] < losses[name][0]


@pytest.mark.slow
def test_a_dead_rank_fails_the_next_call_at_once():
    """A rank killed mid-life: the next call raises naming it instead of hanging on the
    survivor (blocked in a collective), and the workers are closed."""
    import os
    import signal
    import time

    from twinkle.model.megatron.parallel import ParallelMegatronModel

    model = ParallelMegatronModel("tiny://qwen3", tp_size=2)
    try:
        model.add_adapter_to_model("a", {"r": 4, "target_modules": "all-linear"})
        os.kill(model._procs[1].pid, signal.SIGKILL)
        model._procs[1].join(timeout=30)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"ranks \{1: -9\} exited"):
            model.forward_backward(make_batch(2, 8, 0), adapter_name="a")
        assert time.monotonic() - start < 30
        assert not model._procs  # closed
        with pytest.raises(RuntimeError, match="closed"):
            model.list_adapters()
    finally:
        model.close()
