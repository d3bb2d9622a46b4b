"""The model operations and gateway routes ModelScope Twinkle's clients call, over HTTP against an
in-process server on the mock backend: the bodies they send are accepted, what the backend lacks is
a clear 400, and the management routes answer the caller's own records only."""

import asyncio

from twinkle.server.testing import client, local_server

MODEL = "/api/v1/model/tiny/qwen3"
ADD = {"adapter_name": "m", "config": {"r": 4, "lora_alpha": 8}}


def _run(server, scenario):
    asyncio.run(scenario(server))


def test_upstream_bodies_are_accepted_and_missing_backend_methods_are_400(tmp_path):
    server = local_server(tmp_path, backend="mock")

    async def scenario(server):
        async with client(server, "alice") as http:
            r = await http.post(f"{MODEL}/add_adapter_to_model", json={**ADD, "save_dir": "/x"})
            assert r.status_code == 200, r.text
            r = await http.post(f"{MODEL}/get_state_dict", json={"adapter_name": "m"})
            assert r.status_code == 400 and "no get_state_dict" in r.text
            r = await http.post(f"{MODEL}/add_metric", json={"adapter_name": "m", "metric_cls": 3})
            assert r.status_code == 400 and "metric_cls must be given by name" in r.text
            body = {"adapter_name": "m", "name": "s", "is_sampler": True, "save_optimizer": True}
            r = await http.post(f"{MODEL}/save", json=body)
            assert r.status_code == 400 and "drop save_optimizer" in r.text
            body = {"adapter_name": "m", "name": "ck", "consumed_train_samples": 5}
            path = (await http.post(f"{MODEL}/save", json=body)).json()["result"]["path"]
            body = {"adapter_name": "m", "path": path, "resume_only_model": True}
            r = await http.post(f"{MODEL}/resume_from_checkpoint", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["result"] == {"cur_step": 0, "consumed_train_samples": 5}
            r = await http.post(f"{MODEL}/load", json={**body, "resume_only_model": True})
            assert r.status_code == 400 and "belongs to resume_from_checkpoint" in r.text
            r = await http.post(f"{MODEL}/upload_status", json={"upload_id": "nope"})
            assert r.status_code == 404 and "no upload 'nope'" in r.text

    _run(server, scenario)


def test_capacity_runs_and_checkpoint_info_are_per_caller(tmp_path):
    server = local_server(tmp_path, backend="mock")

    async def scenario(server):
        async with client(server, "alice") as alice, client(server, "bob") as bob:
            await alice.post(f"{MODEL}/add_adapter_to_model", json=ADD)
            r = await alice.post(f"{MODEL}/save", json={"adapter_name": "m", "name": "ck"})
            path = r.json()["result"]["path"]
            r = await bob.get("/api/v1/capacity_info")
            assert r.json() == {
                "max_loras": 4,
                "used_loras": 1,
                "free_loras": 3,
                "models": {"tiny/qwen3": {"max_loras": 4, "used_loras": 1, "free_loras": 3}},
            }
            r = await bob.get("/api/v1/training_runs", params={"all_users": "true"})
            assert r.json()["training_runs"] == [] and r.json()["scope"] == "own"
            r = await alice.get("/api/v1/training_runs", params={"all_users": "true"})
            assert len(r.json()["training_runs"]) == 1
            r = await alice.get("/api/v1/checkpoint_info", params={"twinkle_path": path})
            info = r.json()
            assert (info["base_model"], info["lora_rank"], info["checkpoint_id"]) == (
                "tiny/qwen3",
                4,
                "weights/ck",
            )
            r = await bob.get("/api/v1/checkpoint_info", params={"twinkle_path": path})
            assert r.status_code == 404
            r = await alice.get("/api/v1/checkpoint_info")
            assert r.status_code == 400 and "twinkle_path" in r.text

    _run(server, scenario)
