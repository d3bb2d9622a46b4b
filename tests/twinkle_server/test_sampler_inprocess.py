"""Sampler deployment in-process: sampling with a tenant's own saved adapter, by twinkle:// path."""

import asyncio

import pytest
from test_gateway_inprocess import MODEL, _train

from twinkle.server.testing import client, local_server

SAMPLER = "/api/v1/sampler/tiny/qwen3"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    return local_server(tmp_path_factory.mktemp("sampler"), sampler=True)


def test_sampling_with_a_saved_adapter_is_deterministic_and_private(server):
    async def scenario():
        async with client(server, "alice") as alice, client(server, "bob") as bob:
            await _train(alice, name="s1", steps=2)
            path = (
                await alice.post(
                    f"{MODEL}/save", json={"adapter_name": "s1", "name": "for-sampler"}
                )
            ).json()["result"]["path"]
            body = {
                "inputs": [[5, 6, 7, 8]],
                "adapter_uri": path,
                "sampling_params": {
                    "max_tokens": 6,
                    "temperature": 1.0,
                    "seed": 3,
                    "num_samples": 2,
                },
            }
            first = await alice.post(f"{SAMPLER}/sample", json=body)
            assert first.status_code == 200, first.text
            (result,) = first.json()["result"]["results"]
            assert len(result["sequences"]) == 2
            assert all(len(s["tokens"]) == len(s["logprobs"]) <= 6 for s in result["sequences"])
            again = await alice.post(f"{SAMPLER}/sample", json=body)
            assert again.json() == first.json()
            base = await alice.post(f"{SAMPLER}/sample", json={**body, "adapter_uri": None})
            assert base.json() != first.json()
            denied = await bob.post(f"{SAMPLER}/sample", json=body)
            assert denied.status_code == 404
            bad = await alice.post(
                f"{SAMPLER}/sample", json={**body, "sampling_params": {"max_tokens": -1}}
            )
            assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]
            bad = await alice.post(
                f"{SAMPLER}/sample", json={**body, "adapter_uri": "twinkle://x/weights/../../etc"}
            )
            assert bad.status_code == 400

    asyncio.run(scenario())
