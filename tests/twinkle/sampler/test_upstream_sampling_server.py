"""The sampler application's side of ModelScope Twinkle's sampling surface, through ASGI:
``add_adapter_to_sampler`` names, log-prob counts and plain-float log-probs on the wire."""

import asyncio

import httpx
import pytest

from twinkle.sampler import MockSampler
from twinkle.server.sampler.deployment import create_sampler_app
from twinkle.server.sampler.service import SamplerService
from twinkle.server.web.errors import NotFound

PARAMS = {"max_tokens": 5, "temperature": 1.0, "seed": 3}


def _no_checkpoints(owner: str, path: str):
    raise NotFound(f"no checkpoint {path!r}")


@pytest.fixture(scope="module")
def app():
    service = SamplerService(MockSampler("mock"), "mock", _no_checkpoints)
    return create_sampler_app(service, lambda headers: headers.get("x-owner", "alice"))


def _post(app, calls):
    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [
                await client.post(f"/{op}", json=body, headers={"x-owner": who})
                for who, op, body in calls
            ]

    return asyncio.run(run())


def test_a_declared_adapter_samples_the_base_model_for_its_owner_only(app):
    sample = {"inputs": [[1, 2, 3]], "sampling_params": PARAMS}
    declared, base, named, other, bad_rank, bad_name = _post(
        app,
        [
            ("alice", "add_adapter_to_sampler", {"adapter_name": "policy", "config": {"r": 8}}),
            ("alice", "sample", sample),
            ("alice", "sample", {**sample, "adapter_uri": "inflight://policy"}),
            ("bob", "sample", {**sample, "adapter_uri": "inflight://policy"}),
            ("alice", "add_adapter_to_sampler", {"adapter_name": "x", "config": {"r": 0}}),
            ("alice", "add_adapter_to_sampler", {"adapter_name": "", "config": {}}),
        ],
    )
    assert declared.status_code == 200, declared.text
    assert declared.json()["result"] == {
        "adapter_name": "policy",
        "adapter_uri": "inflight://policy",
    }
    assert named.status_code == 200, named.text
    assert named.json() == base.json()
    assert other.status_code == 404 and "no live adapter" in other.json()["error"]
    assert bad_rank.status_code == 400 and "config.r must be an integer >= 1" in bad_rank.text
    assert bad_name.status_code == 400 and "adapter_name" in bad_name.text


def test_logprob_counts_send_top_k_and_plain_floats(app):
    (reply,) = _post(
        app,
        [
            (
                "alice",
                "sample",
                {"inputs": [[1, 2, 3]], "sampling_params": {**PARAMS, "logprobs": 2}},
            )
        ],
    )
    assert reply.status_code == 200, reply.text
    (seq,) = reply.json()["result"]["results"][0]["sequences"]
    assert set(seq) == {"tokens", "logprobs", "stop_reason", "text", "topk_logprobs"}
    assert len(seq["logprobs"]) == len(seq["tokens"]) == len(seq["topk_logprobs"]) == 5
    assert all(isinstance(lp, float) for lp in seq["logprobs"])
    for token, lp, top in zip(seq["tokens"], seq["logprobs"], seq["topk_logprobs"]):
        assert len(top) == 2 and top[0][1] >= top[1][1] and top[0][1] >= lp
        assert all(value == pytest.approx(lp) for t, value in top if t == token)
