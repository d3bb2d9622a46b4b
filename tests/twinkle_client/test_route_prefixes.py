"""Route prefixes are the server's configuration: twinkle_client and the Tinker SDK follow the
table the gateway publishes, here the seed's Node-Rank layout (``/models/...``, ``/sampler/...``,
``/processors``), and fall back to the default layout for a server that publishes none."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle_server"))

from seed_layouts import completed
from serving import KEYS

from twinkle_client import TwinkleClient, init_twinkle_client
from twinkle_client.dataset import Dataset, DatasetMeta
from twinkle_client.errors import NotFoundError
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import vLLMSampler
from twinkle_client.types import RouteTable

MODEL_ID = "tiny://qwen3.5"
MODEL_ROUTE = "/models/Qwen/Qwen3.5-4B"  # the seed's prefix, kept although the model is tiny
SAMPLER_ROUTE = "/sampler/Qwen/Qwen3.5-4B"
ROWS = [
    {
        "messages": [
            {"role": "user", "content": f"Say {i}."},
            {"role": "assistant", "content": f"{i}"},
        ]
    }
    for i in range(4)
]


def _features(seed: int) -> list[dict]:
    ids = np.random.default_rng(seed).integers(10, 4000, size=(2, 12)).tolist()
    return [{"input_ids": r, "labels": [-100] * 3 + r[3:]} for r in ids]


@pytest.fixture(scope="module")
def seed_url(tmp_path_factory):
    """The seed's YAML, completed as check-config asks, served in-process on a loopback port."""
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore
    from twinkle.server.testing import serve_in_thread

    root = tmp_path_factory.mktemp("seed-routes")
    data = completed(MODEL_ID, cpu=True)
    data["auth"] = {"api_keys": list(KEYS.values())}
    data["storage"] = {"root": str(root / "storage")}
    server = build_local_server(parse_config(data), store=MemoryStore("seed:"))
    with serve_in_thread(server.app) as url:
        yield url


@pytest.fixture
def alice(seed_url):
    client = init_twinkle_client(base_url=seed_url, api_key=KEYS["alice"], timeout=120)
    yield client
    client.close()


def test_the_gateway_publishes_the_seed_prefixes(alice, seed_url):
    routes = alice.get_routes()
    assert routes.published and routes.gateway == "/api/v1"
    assert routes.models == {"tiny/qwen3.5": MODEL_ROUTE}
    assert routes.samplers == {"tiny/qwen3.5": SAMPLER_ROUTE}
    assert routes.processors == ["/processors"]
    assert alice.model_route(MODEL_ID) == MODEL_ROUTE
    assert alice.processor_route == "/processors"
    # Nothing answers at the default layout: calls that work below went where the table said.
    assert httpx.get(f"{seed_url}/api/v1/model/tiny/qwen3.5/healthz").status_code == 404
    assert httpx.get(f"{seed_url}/api/v1/routes").status_code == 401  # the table needs a key


def test_train_sample_and_a_remote_dataset_at_the_seed_prefixes(alice):
    model = MultiLoraTransformersModel(MODEL_ID)
    assert model.route == MODEL_ROUTE
    model.add_adapter_to_model("seed", {"r": 8, "lora_alpha": 16})
    model.set_optimizer("Adam", lr=2e-2)
    losses = []
    for _ in range(3):
        losses.append(model.forward_backward(inputs=_features(0))["loss"])
        model.clip_grad_and_step()
    assert losses[-1] < losses[0]
    path = model.save("seed-final")

    sampler = vLLMSampler(model_id=MODEL_ID)
    reply = sampler.sample(
        inputs=[[5, 6, 7]], sampling_params={"max_tokens": 4, "seed": 1}, adapter_uri=path
    )
    assert 1 <= len(reply[0].sequences[0].tokens) <= 4

    dataset = Dataset(DatasetMeta(data=ROWS)).set_template(
        "Qwen3_5Template", model_id=MODEL_ID, max_length=32
    )
    dataset.encode(batched=True, timeout=60)
    assert len(dataset) == 4 and "input_ids" in dataset.column_names


def test_an_unknown_model_names_the_served_ones(alice):
    with pytest.raises(NotFoundError, match="unknown base model 'Qwen/Qwen3.5-4B'.*tiny/qwen3.5"):
        MultiLoraTransformersModel("ms://Qwen/Qwen3.5-4B")
    with pytest.raises(NotFoundError, match="samples: tiny/qwen3.5"):
        alice.sampler_route("ms://Qwen/Qwen3.5-9B")


def test_the_tinker_sdk_goes_through_the_gateway_whatever_the_prefixes(seed_url):
    from twinkle_client import init_tinker_client

    init_tinker_client()
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=seed_url, api_key=KEYS["bob"])
    try:
        training = service.create_lora_training_client(base_model="tiny/qwen3.5", rank=4).result(
            timeout=60
        )
        tokens = _features(1)[0]["input_ids"]
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
        )
        fwd = training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
        assert fwd.result(timeout=60).metrics["loss:sum"] > 0
        sampling = training.save_weights_and_get_sampling_client().result(timeout=60)
        prompt = types.ModelInput.from_ints(tokens[:4])
        sample = sampling.sample(
            prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=3, seed=0)
        ).result(timeout=60)
        assert sample.sequences[0].tokens
    finally:
        service.close("success").result(timeout=30)


class _OlderServer(httpx.HTTPTransport):
    """The live default-layout server as a version without ``GET /routes``."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/routes":
            return httpx.Response(404, json={"error": "Not Found"})
        return super().handle_request(request)


def test_a_server_without_a_route_table_gets_the_default_layout(live):
    with TwinkleClient(
        base_url=live[0], api_key=KEYS["alice"], timeout=120, transport=_OlderServer()
    ) as old:
        assert old.get_routes().published is False
        assert old.model_route("tiny://qwen3") == "/api/v1/model/tiny/qwen3"
        assert old.processor_route == "/api/v1/processor"
        model = MultiLoraTransformersModel("tiny://qwen3", client=old)
        model.add_adapter_to_model("old", {"r": 4})
        assert model.forward_backward(inputs=_features(2))["loss"] > 0
    with TwinkleClient(base_url=live[0], api_key=KEYS["alice"]) as new:
        assert new.get_routes().models == {"tiny/qwen3": "/api/v1/model/tiny/qwen3"}


def test_the_table_is_asked_for_once_per_client():
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json={"models": {"a/b": "/m/a-b"}, "processors": []})

    client = TwinkleClient(
        base_url="http://t.test", transport=httpx.MockTransport(handler), heartbeat_interval_s=None
    )
    try:
        assert [client.model_route("a/b") for _ in range(3)] == ["/m/a-b"] * 3
        with pytest.raises(NotFoundError, match="no processor application"):
            _ = client.processor_route
        assert seen == ["/api/v1/routes"]
    finally:
        client.close()
    assert RouteTable.default_layout().sampler_route("a/b") == "/api/v1/sampler/a/b"
