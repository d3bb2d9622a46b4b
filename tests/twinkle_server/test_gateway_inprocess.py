"""Gateway + model deployment in one process: auth, isolation, training over HTTP, bad input."""

import asyncio

import numpy as np
import pytest

from twinkle.server.testing import client, local_server

MODEL = "/api/v1/model/tiny/qwen3"


def _features(seed=0, rows=2, seq=12):
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 4000, size=(rows, seq)).tolist()
    return [{"input_ids": r, "labels": [-100] * 3 + r[3:]} for r in ids]


@pytest.fixture
def server(tmp_path):
    return local_server(tmp_path)


def run(coro):
    return asyncio.run(coro)


async def _train(http, name="default", steps=3):
    r = await http.post(
        f"{MODEL}/add_adapter_to_model",
        json={"adapter_name": name, "config": {"r": 8, "lora_alpha": 16}},
    )
    assert r.status_code == 200, r.text
    run_id = r.json()["result"]["training_run_id"]
    await http.post(
        f"{MODEL}/set_optimizer", json={"adapter_name": name, "optimizer": "Adam", "lr": 1e-2}
    )
    losses = []
    for _ in range(steps):
        r = await http.post(
            f"{MODEL}/forward_backward", json={"adapter_name": name, "inputs": _features()}
        )
        assert r.status_code == 200, r.text
        losses.append(r.json()["result"]["loss"])
        r = await http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": name})
        assert r.status_code == 200, r.text
    return run_id, losses


def test_health_needs_no_key_and_everything_else_does(server):
    async def scenario():
        async with client(server, who=None) as anon:
            assert (await anon.get("/api/v1/healthz")).status_code == 200
            assert (await anon.get(f"{MODEL}/healthz")).status_code == 200
            r = await anon.get("/api/v1/training_runs")
            assert r.status_code == 401 and "missing API key" in r.text
            r = await anon.post(f"{MODEL}/forward_backward", json={})
            assert r.status_code == 401
        async with client(server, who=None, **{"X-API-Key": "wrong"}) as bad:
            assert (await bad.get("/api/v1/get_server_capabilities")).status_code == 401
        async with client(server, who=None, **{"X-API-Key": "key-alice-123"}) as ok:
            caps = (await ok.get("/api/v1/get_server_capabilities")).json()
            assert caps["supported_models"][0]["model_name"] == "tiny/qwen3"
            assert caps["supported_models"][0]["trainable"] is True

    run(scenario())


def test_training_runs_and_checkpoints_are_per_key(server):
    async def scenario():
        async with client(server, "alice") as alice, client(server, "bob") as bob:
            run_id, losses = await _train(alice)
            assert losses[-1] < losses[0]
            r = await alice.post(
                f"{MODEL}/save",
                json={"adapter_name": "default", "name": "ck-1", "save_optimizer": True},
            )
            path = r.json()["result"]["path"]
            assert path == f"twinkle://{run_id}/weights/ck-1"
            runs = (await alice.get("/api/v1/training_runs")).json()
            assert [x["training_run_id"] for x in runs["training_runs"]] == [run_id]
            ckpts = (await alice.get(f"/api/v1/training_runs/{run_id}/checkpoints")).json()[
                "checkpoints"
            ]
            assert [c["twinkle_path"] for c in ckpts] == [path]
            # Bob sees nothing of Alice's, and cannot touch it.
            assert (await bob.get("/api/v1/training_runs")).json()["training_runs"] == []
            assert (await bob.get(f"/api/v1/training_runs/{run_id}")).status_code == 404
            assert (await bob.get(f"/api/v1/training_runs/{run_id}/checkpoints")).status_code == 404
            assert (
                await bob.delete(f"/api/v1/training_runs/{run_id}/checkpoints/weights/ck-1")
            ).status_code == 404
            await bob.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "default", "config": {"r": 4}},
            )
            r = await bob.post(f"{MODEL}/load", json={"adapter_name": "default", "path": path})
            assert r.status_code == 404
            # Alice can resume her own checkpoint.
            r = await alice.post(
                f"{MODEL}/resume_from_checkpoint", json={"adapter_name": "default", "path": path}
            )
            assert r.status_code == 200 and r.json()["result"]["cur_step"] == 3

    run(scenario())


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b"{not json", 400, "malformed JSON"),
        (b"[1, 2]", 400, "must be an object"),
        (b'{"adapter_name": "default", "inputs": "text"}', 400, "non-empty list"),
        (
            b'{"adapter_name": "default", "inputs": [{"input_ids": ["a"]}]}',
            400,
            "not a list of numbers",
        ),
        (
            b'{"adapter_name": "default", "inputs": [{"input_ids": [1, 99999999], "labels": [1, 2]}]}',
            400,
            "vocabulary",
        ),
        (b'{"adapter_name": "nope", "inputs": []}', 404, "unknown adapter"),
    ],
)
def test_bad_requests_get_clear_4xx_and_change_nothing(server, body, status, message):
    async def scenario():
        async with client(server, "alice") as alice:
            await alice.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "default", "config": {"r": 4}},
            )
            service = next(iter(server.services.values()))
            before = {
                k: v.clone()
                for k, v in service.model.adapter_state_dict(next(iter(service.adapters))).items()
            }
            r = await alice.post(
                f"{MODEL}/forward_backward",
                content=body,
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == status and message in r.json()["error"], r.text
            after = service.model.adapter_state_dict(next(iter(service.adapters)))
            assert all((before[k] == after[k]).all() for k in after)
            assert all(p.grad is None for t in service.model.tenants.values() for p in t.params)

    run(scenario())


def test_oversized_bodies_are_refused(tmp_path):
    server = local_server(tmp_path, server_args={"max_request_bytes": 1000})

    async def scenario():
        async with client(server, "alice") as alice:
            r = await alice.post(f"{MODEL}/forward_backward", json={"inputs": _features(rows=20)})
            assert r.status_code == 413 and "over the limit" in r.json()["error"]

    run(scenario())


def test_a_sampled_feature_trains_with_its_messages_and_user_data(server):
    """A sampler's ``new_input_feature`` carries the conversation and the row's data beside its
    ids: the server trains on the ids and leaves those fields alone, with the same loss as the
    bare ids."""

    async def scenario():
        async with client(server, "alice") as alice:
            r = await alice.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "default", "config": {"r": 4}},
            )
            assert r.status_code == 200, r.text
            bare = _features(seed=3)
            rich = [
                {
                    **f,
                    "messages": [
                        {"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "4"},
                    ],
                    "user_data": [["answer", "4"]],
                    "tools": [],
                }
                for f in bare
            ]
            losses = []
            for inputs in (bare, rich):
                r = await alice.post(
                    f"{MODEL}/forward_only", json={"adapter_name": "default", "inputs": inputs}
                )
                assert r.status_code == 200, r.text
                losses.append(r.json()["result"]["loss"])
            assert losses[0] == pytest.approx(losses[1], rel=1e-6)
            r = await alice.post(
                f"{MODEL}/forward_backward", json={"adapter_name": "default", "inputs": rich}
            )
            assert r.status_code == 200, r.text

    run(scenario())
