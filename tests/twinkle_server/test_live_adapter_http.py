"""Sampling from the live training adapter over HTTP: ``twinkle_client``'s
``sampler.load_adapter_from_model`` against an in-process server on a real socket.

In-memory samples must equal those of a checkpoint of the same weights, a second step must be
visible, another key must get 404 and change nothing, and bad input a 400 naming the field.
"""

import httpx
import pytest

from twinkle.server.testing import KEYS, local_server, serve_in_thread
from twinkle_client import TwinkleClient, init_twinkle_client
from twinkle_client.errors import NotFoundError
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import TorchSampler

MODEL_ID = "tiny://qwen3"
PUBLISH = "/api/v1/publish_live_adapter"
PROMPTS = [[11, 22, 33, 44], [55, 66, 77]]
GREEDY = {"max_tokens": 6, "temperature": 0.0}
ROWS = [{"input_ids": list(range(10, 26)), "labels": list(range(10, 26))}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = local_server(tmp_path_factory.mktemp("live-adapter"), sampler=True)
    with serve_in_thread(server.app) as url:
        # The remote samplers start on the process default client (alice), as in a script.
        clients = {
            "alice": init_twinkle_client(base_url=url, api_key=KEYS["alice"], timeout=120),
            "bob": TwinkleClient(base_url=url, api_key=KEYS["bob"], timeout=120),
        }
        yield url, server, clients
        for c in clients.values():
            c.close()


_MADE: list = []


@pytest.fixture(autouse=True)
def _free_adapters():
    """The module's server holds 3 adapters per key: free each test's."""
    yield
    while _MADE:
        model, name = _MADE.pop()
        model.remove_adapter(name)


def _model(client, name):
    model = MultiLoraTransformersModel(MODEL_ID, client=client)
    model.add_adapter_to_model(name, {"r": 8, "lora_alpha": 32})
    _MADE.append((model, name))
    model.set_optimizer("AdamW", lr=5e-2, adapter_name=name)
    return model


def _step(model, name):
    model.forward_backward(inputs=ROWS, adapter_name=name)
    model.clip_grad_and_step(adapter_name=name)


def _sampler(client):
    sampler = TorchSampler(MODEL_ID)
    sampler.client = client
    return sampler


def _sample(sampler, **adapter):
    out = sampler.sample(PROMPTS, GREEDY, **adapter)
    return [(s.tokens, s.logprobs) for r in out for s in r.sequences]


def _assert_same(x, y, atol=1e-6):
    assert [t for t, _ in x] == [t for t, _ in y]
    for (_, lx), (_, ly) in zip(x, y):
        assert all(abs(a - b) <= atol for a, b in zip(lx, ly)), (lx, ly)


def test_live_adapter_equals_its_checkpoint_and_follows_each_step(live):
    _, _, clients = live
    model, sampler = _model(clients["alice"], "live"), _sampler(clients["alice"])
    _step(model, "live")
    uri = sampler.load_adapter_from_model(model, "live")
    assert uri == "inflight://live"
    first = _sample(sampler, adapter_uri=uri)
    path = model.save("live-1", save_optimizer=False, adapter_name="live")
    _assert_same(first, _sample(sampler, adapter_uri=path))
    _assert_same(first, _sample(sampler, adapter_name="live"))
    assert first != _sample(sampler)  # the trained adapter changes the samples

    _step(model, "live")
    assert _sample(sampler, adapter_uri=uri) == first  # held until published again
    sampler.load_adapter_from_model(model, "live")
    second = _sample(sampler, adapter_uri=uri)
    _assert_same(second, _sample(sampler, adapter_uri=model.save("live-2", adapter_name="live")))
    assert [lp for _, lp in second] != [lp for _, lp in first]


def test_base64_encoding_samples_the_same_weights(live):
    url, _, clients = live
    model, sampler = _model(clients["alice"], "b64"), _sampler(clients["alice"])
    _step(model, "b64")
    sampler.load_adapter_from_model(model, "b64")
    binary = _sample(sampler, adapter_uri="inflight://b64")
    r = httpx.post(
        url + PUBLISH,
        json={"base_model": "tiny/qwen3", "adapter_name": "b64", "encoding": "base64"},
        headers={"Authorization": f"Bearer {KEYS['alice']}"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["encoding"] == "base64"
    assert _sample(sampler, adapter_uri="inflight://b64") == binary


def test_another_key_gets_404_and_bad_input_400_changing_nothing(live):
    url, _, clients = live
    model, alice = _model(clients["alice"], "mine"), _sampler(clients["alice"])
    _step(model, "mine")
    alice.load_adapter_from_model(model, "mine")
    before = _sample(alice, adapter_uri="inflight://mine")

    bob = _sampler(clients["bob"])
    with pytest.raises(NotFoundError, match="no live adapter"):
        bob.sample(PROMPTS, GREEDY, adapter_uri="inflight://mine")
    bob_model = MultiLoraTransformersModel(MODEL_ID, client=clients["bob"])
    bob_model._adapters.append("mine")  # bob names alice's adapter
    with pytest.raises(NotFoundError):
        bob.load_adapter_from_model(bob_model, "mine")

    def post(body, who="alice", path=PUBLISH):
        return httpx.post(
            url + path, json=body, headers={"Authorization": f"Bearer {KEYS[who]}"}, timeout=60
        )

    base = {"base_model": "tiny/qwen3", "adapter_name": "mine"}
    assert post(base, who="bob").status_code == 404
    for body, field in [
        ({**base, "encoding": "zip"}, "encoding"),
        ({**base, "adapter_name": 5}, "adapter_name"),
        ({"adapter_name": "mine"}, "base_model"),
        ({**base, "extra": 1}, "extra"),
        ({**base, "adapter_name": "../x"}, "adapter_name"),
    ]:
        r = post(body)
        assert r.status_code == 400 and field in r.json()["error"], (body, r.text)
    assert post({**base, "base_model": "tiny/none"}).status_code == 404
    # The tensors form is for other deployments; over HTTP it is a 400, the model's op a 404.
    r = post(
        {"adapter_uri": "inflight://mine", "config": {"r": 8}, "tensors": {"w": [1.0]}},
        path="/api/v1/sampler/tiny/qwen3/publish_adapter",
    )
    assert r.status_code == 400 and "tensors" in r.json()["error"]
    r = post({"config": {}}, path="/api/v1/sampler/tiny/qwen3/publish_adapter")
    assert r.status_code == 400 and "adapter_uri" in r.json()["error"]
    r = post({"adapter_name": "mine"}, path="/api/v1/model/tiny/qwen3/adapter_tensors")
    assert r.status_code == 404
    assert _sample(alice, adapter_uri="inflight://mine") == before


def test_a_key_holds_a_bounded_number_of_live_adapters(live):
    """Publishing a new name past the bound drops that key's oldest live adapter, not another
    key's: the sampler's memory stays bounded however many names a key publishes."""
    from twinkle.server.sampler.service import MAX_LIVE_ADAPTERS_PER_KEY

    url, server, clients = live
    model = _model(clients["alice"], "bound")
    _step(model, "bound")
    auth = {"Authorization": f"Bearer {KEYS['alice']}"}
    owner = server.context.authenticate(auth)
    r = httpx.post(
        url + "/api/v1/model/tiny/qwen3/tinker_adapter_state",
        json={"adapter_name": "bound"},
        headers=auth,
        timeout=60,
    )
    state = r.json()["result"]
    pool = server.services["sampler"].sampler.adapters
    mine = f"inflight://{owner}/"
    others = {k for k in pool._in_memory if not k.startswith(mine)}
    for i in range(MAX_LIVE_ADAPTERS_PER_KEY + 2):
        body = {"adapter_uri": f"inflight://n{i}", **state}
        body.pop("step")
        r = httpx.post(
            url + "/api/v1/sampler/tiny/qwen3/publish_adapter", json=body, headers=auth, timeout=60
        )
        assert r.status_code == 200, r.text
    held = [k for k in pool._in_memory if k.startswith(mine)]
    assert len(held) == MAX_LIVE_ADAPTERS_PER_KEY
    assert f"{mine}n0" not in held and f"{mine}n1" not in held
    assert f"{mine}n{MAX_LIVE_ADAPTERS_PER_KEY + 1}" in held
    assert others <= set(pool._in_memory)
