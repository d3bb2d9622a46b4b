"""The OpenAI-compatible API (``/api/v1/openai/v1``) with the official ``openai`` client.

A live in-process server (tiny://qwen3, torch sampler) on a loopback port: sync, async and
streaming calls must answer what the native sampler answers for the same prompt, adapter and
parameters. In-process httpx requests check the error shape, the limits and the isolation.
"""

import asyncio

import httpx
import openai
import pytest

from twinkle.server.config import parse_config
from twinkle.server.process.local import build_local_server
from twinkle.server.state import MemoryStore
from twinkle.server.testing import KEYS, config_dict, serve_in_thread

API = "/api/v1/openai/v1"
MODEL = "/api/v1/model/tiny/qwen3"
SAMPLE = "/api/v1/sampler/tiny/qwen3/sample"
BASE = "tiny/qwen3"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]
MAX_LENGTH, MAX_SAMPLES, MAX_TOKENS = 96, 4, 48
ROWS = [{"input_ids": list(range(10, 26)), "labels": list(range(10, 26))}]


def _auth(who):
    return {"Authorization": f"Bearer {KEYS[who]}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = config_dict(sampler=True)
    config["applications"][2]["args"].update(
        max_length=MAX_LENGTH, max_num_samples=MAX_SAMPLES, max_sample_tokens=MAX_TOKENS
    )
    config["storage"] = {"root": str(tmp_path_factory.mktemp("openai") / "storage")}
    return build_local_server(parse_config(config), store=MemoryStore("t:"))


@pytest.fixture(scope="module")
def url(server):
    with serve_in_thread(server.app) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def checkpoint(url):
    """Alice's adapter ``oa``, trained two steps, saved (its path) and published live."""
    with httpx.Client(base_url=url, headers=_auth("alice"), timeout=120) as http:
        for op, body in [
            ("add_adapter_to_model", {"adapter_name": "oa", "config": {"r": 8, "lora_alpha": 32}}),
            ("set_optimizer", {"adapter_name": "oa", "optimizer": "AdamW", "lr": 5e-2}),
            ("forward_backward", {"adapter_name": "oa", "inputs": ROWS}),
            ("clip_grad_and_step", {"adapter_name": "oa"}),
            ("forward_backward", {"adapter_name": "oa", "inputs": ROWS}),
            ("clip_grad_and_step", {"adapter_name": "oa"}),
        ]:
            r = http.post(f"{MODEL}/{op}", json=body)
            assert r.status_code == 200, r.text
        r = http.post(f"{MODEL}/save", json={"adapter_name": "oa", "name": "oa-1"})
        assert r.status_code == 200, r.text
        path = r.json()["result"]["path"]
        r = http.post(
            "/api/v1/publish_live_adapter", json={"base_model": BASE, "adapter_name": "oa"}
        )
        assert r.status_code == 200, r.text
    return path


def _client(url, who="alice"):
    return openai.OpenAI(base_url=url + API, api_key=KEYS[who], max_retries=0, timeout=120)


def _native(url, inputs, params, adapter_uri=None):
    """The native sampler's results for the same request."""
    body = {"inputs": inputs, "sampling_params": params, "adapter_uri": adapter_uri}
    r = httpx.post(url + SAMPLE, json=body, headers=_auth("alice"), timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["result"]["results"]


def _finish(seq):
    return "length" if seq["stop_reason"] == "length" else "stop"


# ------------------------------------------------------------------- live, official client
def test_models_lists_the_base_model_and_only_the_callers_checkpoints(url, checkpoint):
    alice = [m.id for m in _client(url).models.list()]
    assert alice[0] == BASE and checkpoint in alice
    bob = [m.id for m in _client(url, "bob").models.list()]
    assert bob == [BASE]
    assert _client(url).models.retrieve(checkpoint).id == checkpoint
    with pytest.raises(openai.NotFoundError) as caught:
        _client(url, "bob").models.retrieve(checkpoint)
    assert caught.value.code == "model_not_found"


def test_sync_chat_answers_what_the_native_sampler_answers(url):
    reply = _client(url).chat.completions.create(
        model=BASE, messages=MESSAGES, max_tokens=8, temperature=0
    )
    (native,) = _native(url, [{"messages": MESSAGES}], {"max_tokens": 8, "temperature": 0})
    (seq,) = native["sequences"]
    (choice,) = reply.choices
    assert reply.object == "chat.completion" and reply.model == BASE
    assert choice.message.role == "assistant" and choice.message.content == seq["text"]
    assert choice.finish_reason == _finish(seq)
    assert reply.usage.prompt_tokens == len(native["prompt_tokens"]) > 10
    assert reply.usage.completion_tokens == len(seq["tokens"])
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streamed_chat_is_the_whole_reply_in_chunks_then_usage(url):
    client = _client(url)
    args = {"model": BASE, "messages": MESSAGES, "max_tokens": 6, "seed": 7, "n": 2}
    whole = client.chat.completions.create(**args)
    chunks = list(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    for choice in whole.choices:
        parts = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(p.delta.content or "" for p in parts) == choice.message.content
        assert [p.finish_reason for p in parts if p.finish_reason] == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_async_completions_and_their_stream(url):
    async def scenario():
        client = openai.AsyncOpenAI(
            base_url=url + API, api_key=KEYS["alice"], max_retries=0, timeout=120
        )
        prompt = [11, 22, 33, 44]
        reply = await client.completions.create(
            model=BASE, prompt=prompt, max_tokens=5, n=2, seed=5, logprobs=2
        )
        (native,) = _native(
            url, [prompt], {"max_tokens": 5, "num_samples": 2, "seed": 5, "topk_logprobs": 2}
        )
        assert [c.text for c in reply.choices] == [s["text"] for s in native["sequences"]]
        for choice, seq in zip(reply.choices, native["sequences"]):
            assert choice.logprobs.token_logprobs == pytest.approx(seq["logprobs"])
            assert len(choice.logprobs.tokens) == len(seq["tokens"])
            assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
        assert reply.usage.prompt_tokens == 4
        assert reply.usage.completion_tokens == sum(len(s["tokens"]) for s in native["sequences"])
        whole = await client.completions.create(
            model=BASE, prompt="The sky is", max_tokens=6, temperature=0, echo=True
        )
        assert whole.choices[0].text.startswith("The sky is")
        stream = await client.completions.create(
            model=BASE, prompt="The sky is", max_tokens=6, temperature=0, echo=True, stream=True
        )
        text = "".join([c.choices[0].text async for c in stream if c.choices])
        assert text == whole.choices[0].text
        await client.close()

    asyncio.run(scenario())


def test_a_checkpoint_and_the_live_adapter_sample_their_own_weights_privately(url, checkpoint):
    def token_logprobs(model):
        reply = _client(url).chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True
        )
        return [t.logprob for t in reply.choices[0].logprobs.content]

    params = {"max_tokens": 4, "temperature": 0}
    inputs = [{"messages": MESSAGES}]
    for model, uri in [
        (checkpoint, checkpoint),
        ("inflight://oa", "inflight://oa"),
        (f"inflight://{BASE}/oa", "inflight://oa"),
    ]:
        (native,) = _native(url, inputs, params, adapter_uri=uri)
        assert token_logprobs(model) == pytest.approx(native["sequences"][0]["logprobs"])
    (base,) = _native(url, inputs, params)
    assert token_logprobs(checkpoint) != pytest.approx(base["sequences"][0]["logprobs"])
    for model in (checkpoint, "inflight://oa"):
        with pytest.raises(openai.NotFoundError):
            _client(url, "bob").chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=2
            )


# ---------------------------------------------------------------- in-process: errors, limits
def _post(server, path, who="alice", **kwargs):
    async def call():
        headers = _auth(who) if who else {}
        transport = httpx.ASGITransport(app=server.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            return await http.post(API + path, headers=headers, **kwargs)

    return asyncio.run(call())


def _error(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


CHAT = {"model": BASE, "messages": MESSAGES, "max_tokens": 4}


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"model": BASE}, "messages", "Field required"),
        ({**CHAT, "tempreature": 1}, "tempreature", "Extra inputs"),
        ({**CHAT, "temperature": 3}, "temperature", "less than or equal to 2"),
        ({**CHAT, "n": MAX_SAMPLES + 1}, "n", f"at most {MAX_SAMPLES}"),
        ({**CHAT, "max_tokens": MAX_TOKENS + 1}, "max_tokens", f"at most {MAX_TOKENS}"),
        ({**CHAT, "tools": [{"type": "function"}]}, "tools", "not supported"),
        ({**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "robot"),
        (
            {
                **CHAT,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
                        ],
                    }
                ],
            },
            "messages.0.content.0.image_url.url",
            "data:image/",
        ),
    ],
)
def test_a_bad_chat_body_is_a_400_naming_the_field(server, body, param, says):
    error = _error(_post(server, "/chat/completions", json=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param and says in error["message"], error


def test_malformed_json_and_over_length_prompts_are_400(server):
    error = _error(_post(server, "/chat/completions", content=b"{not json"), 400)
    assert "malformed JSON" in error["message"]
    long_prompt = list(range(10, 10 + MAX_LENGTH - 2))
    body = {"model": BASE, "prompt": long_prompt, "max_tokens": 8}
    error = _error(_post(server, "/completions", json=body), 400)
    assert f"max_length={MAX_LENGTH}" in error["message"] and error["param"] == "prompt"
    body = {**CHAT, "messages": [{"role": "user", "content": "word " * MAX_LENGTH}]}
    error = _error(_post(server, "/chat/completions", json=body), 400)
    assert f"max_length={MAX_LENGTH}" in error["message"] and error["param"] == "messages"


def test_keys_and_models_are_checked_like_every_other_route(server, checkpoint):
    error = _error(_post(server, "/chat/completions", who=None, json=CHAT), 401)
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    for model in ("no/such-model", "twinkle://run-x/weights/nothing", checkpoint):
        error = _error(
            _post(server, "/chat/completions", who="bob", json={**CHAT, "model": model}), 404
        )
        assert error["code"] == "model_not_found" and error["param"] == "model"
    error = _error(
        _post(server, "/chat/completions", who="bob", json={**CHAT, "model": "inflight://oa"}), 404
    )
    assert "no live adapter" in error["message"]
    ok = _post(server, "/chat/completions", json={**CHAT, "model": checkpoint})
    assert ok.status_code == 200 and ok.json()["model"] == checkpoint
