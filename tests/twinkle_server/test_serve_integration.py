"""The real thing: gateway, model and sampler as Ray Serve applications on loopback HTTP."""

import concurrent.futures
import os

import httpx
import numpy as np
import pytest

from twinkle.server.testing import KEYS, config_dict, free_port

pytestmark = pytest.mark.integration

# Free prefixes, as in the seed's Node-Rank YAML: clients learn them from GET /api/v1/routes.
MODEL = "/models/tiny/qwen3"
SAMPLER = "/sampler/tiny/qwen3"


@pytest.fixture(scope="module")
def serve_url(tmp_path_factory):
    import ray
    from ray import serve

    from twinkle.server.config import parse_config
    from twinkle.server.process.launch import LOCAL_RAY_ENV, deploy

    data = config_dict(sampler=True)
    for app, prefix in zip(data["applications"][1:], (MODEL, SAMPLER), strict=True):
        app["route_prefix"] = prefix
    data["http_options"] = {"host": "127.0.0.1", "port": free_port()}
    data["storage"] = {"root": str(tmp_path_factory.mktemp("serve-storage"))}
    config = parse_config(data)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    saved = {name: os.environ.get(name) for name in LOCAL_RAY_ENV}
    os.environ.update(LOCAL_RAY_ENV)  # the Ray settings `twinkle-server launch` starts Ray with
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        namespace=f"twinkle-test-{os.getpid()}",
    )
    try:
        url = deploy(config, ready_timeout_s=180)
        yield url.rsplit("/api/v1", 1)[0]
    finally:
        serve.shutdown()
        ray.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _features(seed):
    ids = np.random.default_rng(seed).integers(10, 4000, size=(2, 16)).tolist()
    return [{"input_ids": r, "labels": [-100] * 4 + r[4:]} for r in ids]


def _tenant(url, who, steps=4):
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {KEYS[who]}"}, timeout=120
    ) as http:
        r = http.post(
            f"{MODEL}/add_adapter_to_model", json={"adapter_name": "main", "config": {"r": 8}}
        )
        assert r.status_code == 200, r.text
        http.post(
            f"{MODEL}/set_optimizer", json={"adapter_name": "main", "optimizer": "Adam", "lr": 2e-2}
        )
        losses = []
        for _ in range(steps):
            r = http.post(
                f"{MODEL}/forward_backward", json={"adapter_name": "main", "inputs": _features(1)}
            )
            assert r.status_code == 200, r.text
            losses.append(r.json()["result"]["loss"])
            http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "main"})
        r = http.post(f"{MODEL}/save", json={"adapter_name": "main", "name": "final"})
        assert r.status_code == 200, r.text
        path = r.json()["result"]["path"]
        return losses, path


def test_two_tenants_train_concurrently_and_sample_with_their_adapters(serve_url):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        (alice_losses, alice_path), (bob_losses, bob_path) = pool.map(
            lambda w: _tenant(serve_url, w), ["alice", "bob"]
        )
    assert alice_losses[-1] < alice_losses[0] and bob_losses[-1] < bob_losses[0]
    with httpx.Client(
        base_url=serve_url, headers={"X-API-Key": KEYS["alice"]}, timeout=120
    ) as http:
        status = http.get(f"{MODEL}/status").json()
        assert status["adapters"] == 2
        routes = http.get("/api/v1/routes").json()
        assert routes["models"] == {"tiny/qwen3": MODEL}
        assert routes["samplers"] == {"tiny/qwen3": SAMPLER}
        runs = http.get("/api/v1/training_runs").json()["training_runs"]
        assert len(runs) == 1  # only Alice's own run
        body = {
            "inputs": [[5, 6, 7]],
            "adapter_uri": alice_path,
            "sampling_params": {"max_tokens": 4, "seed": 1},
        }
        r = http.post(f"{SAMPLER}/sample", json=body)
        assert r.status_code == 200, r.text
        assert len(r.json()["result"]["results"][0]["sequences"][0]["tokens"]) <= 4
        assert (
            http.post(f"{SAMPLER}/sample", json={**body, "adapter_uri": bob_path}).status_code
            == 404
        )
        assert http.get("/api/v1/training_runs", headers={"X-API-Key": "nope"}).status_code == 401


def test_a_model_serves_its_own_address_and_twinkle_client_trains_there(serve_url):
    """Direct ingress: the model replica also answers on its own loopback port, with the same
    routes and the same keys; twinkle_client asks for that address and sends training calls
    there (the raw calls above went through Serve's proxy)."""
    from twinkle_client import TwinkleClient
    from twinkle_client.model import MultiLoraTransformersModel

    with httpx.Client(base_url=serve_url, timeout=60) as http:
        assert http.get(f"{MODEL}/endpoint").status_code == 401
        reply = http.get(f"{MODEL}/endpoint", headers={"Authorization": f"Bearer {KEYS['bob']}"})
    direct = reply.json()["direct_url"]
    address = httpx.URL(direct)
    assert address.host == "127.0.0.1" and address.port != httpx.URL(serve_url).port
    with httpx.Client(base_url=direct, timeout=60) as http:
        assert http.get(f"{MODEL}/healthz").status_code == 200
        body = {"adapter_name": "x", "config": {"r": 8}}
        assert http.post(f"{MODEL}/add_adapter_to_model", json=body).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (
            http.post(f"{MODEL}/add_adapter_to_model", json=body, headers=wrong).status_code == 401
        )

    with TwinkleClient(base_url=serve_url, api_key=KEYS["bob"], timeout=120) as bob:
        model = MultiLoraTransformersModel("tiny://qwen3", client=bob)
        model.add_adapter_to_model("direct", {"r": 8, "lora_alpha": 16})
        model.set_optimizer("Adam", lr=2e-2)
        losses = []
        for _ in range(4):
            losses.append(model.forward_backward(inputs=_features(2))["loss"])
            model.clip_grad_and_step()
        assert bob._routes[MODEL].base_url == direct  # the calls went to the replica's port
    assert losses[-1] < losses[0]


def test_a_live_adapter_reaches_the_sampler_through_serve_handles(serve_url):
    """``POST /publish_live_adapter`` across real Serve replicas: the model's tensors travel
    through the handles (no file) and sample what a checkpoint of the same weights samples."""
    with httpx.Client(
        base_url=serve_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}, timeout=120
    ) as http:
        r = http.post(
            f"{MODEL}/add_adapter_to_model", json={"adapter_name": "live", "config": {"r": 8}}
        )
        assert r.status_code == 200, r.text
        http.post(
            f"{MODEL}/set_optimizer", json={"adapter_name": "live", "optimizer": "Adam", "lr": 5e-2}
        )
        http.post(
            f"{MODEL}/forward_backward", json={"adapter_name": "live", "inputs": _features(2)}
        )
        http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "live"})
        r = http.post(
            "/api/v1/publish_live_adapter",
            json={"base_model": "tiny/qwen3", "adapter_name": "live"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["adapter_uri"] == "inflight://live"
        greedy = {"max_tokens": 5, "temperature": 0.0}

        def sample(uri, key="alice"):
            body = {"inputs": [[5, 6, 7, 8]], "adapter_uri": uri, "sampling_params": greedy}
            return http.post(
                f"{SAMPLER}/sample", json=body, headers={"Authorization": f"Bearer {KEYS[key]}"}
            )

        live = sample("inflight://live").json()["result"]["results"][0]["sequences"][0]
        path = http.post(
            f"{MODEL}/save", json={"adapter_name": "live", "name": "live-check"}
        ).json()["result"]["path"]
        saved = sample(path).json()["result"]["results"][0]["sequences"][0]
        assert live["tokens"] == saved["tokens"]
        assert all(abs(a - b) <= 1e-6 for a, b in zip(live["logprobs"], saved["logprobs"]))
        assert sample("inflight://live", key="bob").status_code == 404
