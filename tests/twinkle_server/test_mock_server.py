"""The mock backend and mock sampler behind the server: train, save, sample with the adapter."""

import asyncio

import numpy as np

from twinkle.server.config import parse_config
from twinkle.server.process.local import build_local_server
from twinkle.server.state import MemoryStore
from twinkle.server.testing import client

MODEL = "/api/v1/model/tiny/qwen3.5"
SAMPLER = "/api/v1/sampler/tiny/qwen3.5"


def test_mock_cookbook_config_trains_and_samples(tmp_path):
    import yaml

    data = yaml.safe_load(open("cookbook/client/server/mock/server_config.yaml"))
    data["applications"] = [a for a in data["applications"] if a["import_path"] != "processor"]
    data["auth"] = {"api_keys": ["key-alice-123"]}
    data["storage"] = {"root": str(tmp_path)}
    server = build_local_server(parse_config(data), store=MemoryStore("m:"))
    ids = np.random.default_rng(0).integers(10, 4000, size=(2, 12)).tolist()
    features = [{"input_ids": r, "labels": r} for r in ids]

    async def scenario():
        async with client(server, "alice") as http:
            r = await http.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "m", "config": {"r": 4, "lora_alpha": 8}},
            )
            assert r.status_code == 200, r.text
            await http.post(
                f"{MODEL}/set_optimizer",
                json={"adapter_name": "m", "optimizer": "Adam", "lr": 0.05},
            )
            losses = []
            for _ in range(10):
                r = await http.post(
                    f"{MODEL}/forward_backward", json={"adapter_name": "m", "inputs": features}
                )
                assert r.status_code == 200, r.text
                losses.append(r.json()["result"]["loss"])
                await http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "m"})
            assert losses[-1] < losses[0]
            path = (
                await http.post(f"{MODEL}/save", json={"adapter_name": "m", "name": "ck"})
            ).json()["result"]["path"]
            body = {
                "inputs": [ids[0][:4]],
                "adapter_uri": path,
                "sampling_params": {"max_tokens": 5, "seed": 7, "temperature": 1.0},
            }
            first = await http.post(f"{SAMPLER}/sample", json=body)
            assert first.status_code == 200, first.text
            seq = first.json()["result"]["results"][0]["sequences"][0]
            assert 1 <= len(seq["tokens"]) == len(seq["logprobs"]) <= 5
            assert all(lp <= 0 for lp in seq["logprobs"])
            assert (await http.post(f"{SAMPLER}/sample", json=body)).json() == first.json()

    asyncio.run(scenario())
