"""Served expert parallel: ``device_mesh: {dp_size: 2, ep_size: 2}`` on a Qwen3-MoE model builds
one world of two expert ranks (megatron carves the expert groups from the dp ranks), and two
tenants of different ranks train through the in-process server with the seed's Megatron flow."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from inprocess import client, local_server  # noqa: E402


@pytest.mark.slow
def test_served_ep2_moe_model_trains_two_tenants(tmp_path):
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    server = local_server(
        tmp_path,
        model_id="tiny://qwen3-moe",
        backend="megatron",
        device_group={"name": "model", "ranks": 2, "device_type": "cpu"},
        device_mesh={"device_type": "cpu", "dp_size": 2, "ep_size": 2},
    )
    route = "/api/v1/model/tiny/qwen3-moe"
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

    model = server.services["model"].model
    try:
        assert isinstance(model, ParallelMegatronModel) and model.ep_size == 2
        losses = asyncio.run(go())
    finally:
        model.close()
    for name in losses:
        assert losses[name][-1] < losses[name][0], losses
