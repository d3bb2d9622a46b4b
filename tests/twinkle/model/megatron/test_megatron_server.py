"""``backend: megatron`` behind the in-process server (gateway + model deployment)."""

import asyncio

import numpy as np
import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from twinkle.server.testing import client, local_server  # noqa: E402

MODEL = "/api/v1/model/tiny/qwen3"


def _features(seed=0, rows=2, seq=12):
    ids = np.random.default_rng(seed).integers(10, 4000, size=(rows, seq)).tolist()
    return [{"input_ids": r, "labels": [-100] * 3 + r[3:]} for r in ids]


def test_served_megatron_model_trains_with_the_seed_settings(tmp_path):
    from twinkle.model.megatron import MultiLoraMegatronModel

    server = local_server(tmp_path, backend="megatron")

    async def go():
        async with client(server) as http:
            r = await http.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "default", "config": {"r": 8, "lora_alpha": 16}},
            )
            assert r.status_code == 200, r.text
            r = await http.post(
                f"{MODEL}/set_optimizer",
                json={"adapter_name": "default", "optimizer": "default", "lr": 1e-2},
            )
            assert r.status_code == 200, r.text
            r = await http.post(
                f"{MODEL}/set_lr_scheduler",
                json={
                    "adapter_name": "default",
                    "scheduler": "default",
                    "lr_decay_steps": 1000,
                    "max_lr": 1e-2,
                },
            )
            assert r.status_code == 200, r.text
            losses = []
            for _ in range(4):
                r = await http.post(
                    f"{MODEL}/forward_backward",
                    json={"adapter_name": "default", "inputs": _features()},
                )
                assert r.status_code == 200, r.text
                losses.append(r.json()["result"]["loss"])
                r = await http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "default"})
                assert r.status_code == 200, r.text
            r = await http.post(
                f"{MODEL}/set_optimizer",
                json={"adapter_name": "default", "optimizer": "SGD", "lr": 1e-2},
            )
            assert r.status_code == 400 and "Adam" in r.text, r.text
            return losses

    losses = asyncio.run(go())
    assert losses[-1] < losses[0]
    assert isinstance(server.services["model"].model, MultiLoraMegatronModel)
