"""Limits that hold at the edges (issue 47, items 5, 8, 9 and 12).

5. Sampling enforces the model's ``max_length`` as training does (native and Tinker routes).
8. Conflicting credentials (two different keys, or an ``X-API-Key`` and a bearer of two tenants)
   are refused, never resolved silently.
9. ``target_modules`` that match nothing, do not compile or cost too much to match are a 400
   naming the field, and nothing is created.
12. Messages name the tenant's adapter, a 503 says "retry later" once, and a client that went
    away is logged at INFO.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import pytest
from starlette.datastructures import Headers
from torch import nn

from twinkle.errors import InvalidArgumentError, UnknownAdapterError  # noqa: E402
from twinkle.model.lora import resolve_target_modules  # noqa: E402
from twinkle.server.state import tenant_id_for_key  # noqa: E402
from twinkle.server.testing import KEYS, client, local_server  # noqa: E402
from twinkle.server.web.auth import ApiKeyAuth, AuthError  # noqa: E402
from twinkle.server.web.errors import AtCapacity, BadRequest, NotFound, from_exception  # noqa: E402

MODEL = "/api/v1/model/tiny/qwen3"
SAMPLER = "/api/v1/sampler/tiny/qwen3"
LIMIT = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The model app has ``max_length: 16``; the sampler app sets none and inherits it."""
    return local_server(tmp_path_factory.mktemp("edges"), sampler=True, max_length=LIMIT)


def raw_client(server, headers: list[tuple[str, str]]) -> httpx.AsyncClient:
    """A client whose requests carry exactly ``headers`` (repeated names included)."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=server.app), base_url="http://test", headers=headers
    )


# --- 5. the sampler's length rule --------------------------------------------------------------


def _sample_body(prompt_len: int, max_tokens: int) -> dict:
    return {
        "inputs": [list(range(10, 10 + prompt_len))],
        "sampling_params": {"max_tokens": max_tokens, "temperature": 1.0, "seed": 1},
    }


def test_a_sampler_built_with_max_length_fits_prompt_and_completion_in_it():
    from twinkle.sampler import MockSampler

    sampler = MockSampler("tiny://qwen3", max_length=8)
    fits = sampler.sample([1, 2, 3], sampling_params={"max_tokens": 5, "seed": 0})
    assert len(fits[0].sequences[0].tokens) == 5  # 3 + 5 == 8: exactly the limit
    with pytest.raises(InvalidArgumentError, match="ask for max_tokens <= 5"):
        sampler.sample([1, 2, 3], sampling_params={"max_tokens": 6})
    chat = {"messages": [{"role": "user", "content": "hello there friend"}]}
    with pytest.raises(InvalidArgumentError, match="prompt tokens, over the model's max_length=8"):
        sampler.sample([chat], sampling_params={"max_tokens": 1})


def test_the_sampler_takes_its_own_max_length_else_the_models():
    from twinkle.server.config import parse_config
    from twinkle.server.sampler.service import SampleLimits
    from twinkle.server.testing import config_dict

    def limit(model_max: int | None, sampler_max: int | None) -> int | None:
        raw = config_dict(sampler=True, **({"max_length": model_max} if model_max else {}))
        if sampler_max is not None:
            raw["applications"][2]["args"]["max_length"] = sampler_max
        config = parse_config(raw)
        return SampleLimits.of(config.applications[2].args, config).max_length

    assert limit(16, None) == 16
    assert limit(16, 32) == 32
    assert limit(None, None) is None


def test_native_sampling_refuses_prompts_over_the_models_max_length(server):
    async def scenario():
        async with client(server) as alice:
            for prompt_len, max_tokens, why in (
                (LIMIT + 1, 1, f"has {LIMIT + 1} prompt tokens"),
                (20_000, 1, "has 20000 prompt tokens"),
                (10, 10, "sampling_params.max_tokens=10"),
            ):
                reply = await alice.post(
                    f"{SAMPLER}/sample", json=_sample_body(prompt_len, max_tokens)
                )
                assert reply.status_code == 400, (prompt_len, max_tokens, reply.text)
                message = reply.json()["error"]
                assert f"max_length={LIMIT}" in message and why in message, message
            fits = await alice.post(f"{SAMPLER}/sample", json=_sample_body(10, LIMIT - 10))
            assert fits.status_code == 200, fits.text
            (result,) = fits.json()["result"]["results"]
            assert len(result["sequences"][0]["tokens"]) <= LIMIT - 10
            # A trajectory is measured once rendered (by the template, on the sampler).
            long_chat = {"messages": [{"role": "user", "content": "count " * 40}]}
            body = {"inputs": [long_chat], "sampling_params": {"max_tokens": 1}}
            reply = await alice.post(f"{SAMPLER}/sample", json=body)
            assert reply.status_code == 400, reply.text
            assert f"max_length={LIMIT}" in reply.json()["error"]
            # Training refuses the same prompt with the same limit.
            added = await alice.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "len", "config": {"r": 4, "lora_alpha": 8}},
            )
            assert added.status_code == 200, added.text
            ids = list(range(10, 10 + LIMIT + 1))
            train = await alice.post(
                f"{MODEL}/forward_backward",
                json={"adapter_name": "len", "inputs": [{"input_ids": ids, "labels": ids}]},
            )
            assert train.status_code == 400 and f"max_length={LIMIT}" in train.json()["error"]

    asyncio.run(scenario())


def test_tinker_sampling_refuses_prompts_over_the_models_max_length(server):
    async def outcome(http: httpx.AsyncClient, sampler_id: str, tokens: int, max_tokens: int):
        body = {
            "num_samples": 1,
            "prompt": {
                "chunks": [{"type": "encoded_text", "tokens": list(range(10, 10 + tokens))}]
            },
            "sampling_params": {"max_tokens": max_tokens, "temperature": 1.0},
            "sampling_session_id": sampler_id,
            "seq_id": tokens * 1000 + max_tokens,
        }
        reply = await http.post("/api/v1/asample", json=body)
        if reply.status_code != 200:
            return reply.status_code, reply.json()["error"]
        rid = reply.json()["request_id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            assert got.status_code == 200, got.text
            if got.headers.get("content-type", "").startswith("application/x-protobuf"):
                return 200, None
            data = got.json()
            if "error" in data:
                return (400 if data.get("category") == "user" else 500), data["error"]
            if data.get("type") != "try_again":
                return 200, None
            await asyncio.sleep(0.01)
        raise AssertionError("the sample future never finished")

    async def scenario():
        async with client(server) as alice:
            session = await alice.post("/api/v1/create_session", json={"tags": []})
            sid = session.json()["session_id"]
            created = await alice.post(
                "/api/v1/create_sampling_session",
                json={"session_id": sid, "sampling_session_seq_id": 0, "base_model": "tiny/qwen3"},
            )
            sampler_id = created.json()["sampling_session_id"]
            for tokens, max_tokens in ((LIMIT + 1, 1), (10, 10)):
                status, message = await outcome(alice, sampler_id, tokens, max_tokens)
                assert status == 400 and f"max_length={LIMIT}" in message, (status, message)
            assert (await outcome(alice, sampler_id, 10, LIMIT - 10)) == (200, None)

    asyncio.run(scenario())


# --- 8. conflicting credentials ----------------------------------------------------------------

A, B = "edges-key-alice-0001", "edges-key-bob-00002"


def _headers(*pairs: tuple[str, str]) -> Headers:
    return Headers(raw=[(k.lower().encode(), v.encode()) for k, v in pairs])


@pytest.mark.parametrize(
    "pairs",
    [
        (("X-API-Key", A), ("X-API-Key", B)),
        (("Authorization", f"Bearer {A}"), ("Authorization", f"Bearer {B}")),
    ],
    ids=["two-x-api-keys", "two-bearers"],
)
def test_two_different_values_of_one_credential_header_are_a_400(pairs):
    auth = ApiKeyAuth(keys=[A, B], environ={})
    for order in (pairs, pairs[::-1]):
        with pytest.raises(BadRequest) as refused:
            auth.authenticate(_headers(*order))
        assert refused.value.status == 400
        assert "conflicting credentials" in refused.value.message
        assert A not in refused.value.message and B not in refused.value.message


def test_credentials_of_two_tenants_are_a_401_and_agreeing_ones_pass():
    auth = ApiKeyAuth(keys=[A, B], environ={})
    with pytest.raises(AuthError) as refused:
        auth.authenticate(_headers(("X-API-Key", A), ("Authorization", f"Bearer {B}")))
    assert refused.value.status_code == 401 and "different tenants" in refused.value.detail
    # One bad credential beside a good one is not skipped over either.
    with pytest.raises(AuthError) as refused:
        auth.authenticate(_headers(("X-API-Key", A), ("Authorization", "Bearer not-a-key-000")))
    assert refused.value.status_code == 401
    alice = tenant_id_for_key(A)
    for pairs in (
        (("X-API-Key", A), ("X-API-Key", A)),
        (("X-API-Key", A), ("Authorization", f"Bearer {A}")),
        (("X-API-Key", f"tml-{A}"), ("Authorization", f"Bearer {A}")),
        (("X-API-Key", A), ("Authorization", f"Basic {B}")),  # not a credential of ours
    ):
        assert auth.authenticate(_headers(*pairs)).tenant_id == alice


def test_conflicting_headers_over_http_and_the_sdks_token_beside_its_key(server):
    async def scenario():
        two = [("X-API-Key", KEYS["alice"]), ("X-API-Key", KEYS["bob"])]
        async with raw_client(server, two) as http:
            reply = await http.get("/api/v1/training_runs")
            assert reply.status_code == 400 and "conflicting credentials" in reply.text
            reply = await http.post(f"{MODEL}/get_train_configs", json={"adapter_name": "x"})
            assert reply.status_code == 400 and "conflicting credentials" in reply.text
        same = [("X-API-Key", KEYS["alice"]), ("X-API-Key", KEYS["alice"])]
        async with raw_client(server, same) as http:
            assert (await http.get("/api/v1/training_runs")).status_code == 200
        async with raw_client(server, [("X-API-Key", KEYS["alice"])]) as http:
            minted = await http.post("/api/v1/auth/token", json={})
            assert minted.status_code == 200, minted.text
            jwt = minted.json()["jwt"]
        # The Tinker SDK with twinkle_client's patch: the token in X-API-Key, the key as bearer.
        for bearer, status in ((KEYS["alice"], 200), (KEYS["bob"], 401)):
            pairs = [("X-API-Key", jwt), ("Authorization", f"Bearer {bearer}")]
            async with raw_client(server, pairs) as http:
                assert (await http.get("/api/v1/training_runs")).status_code == status

    asyncio.run(scenario())


# --- 9. target_modules -------------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.v_proj, self.o_proj = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)


class _Layers(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block() for _ in range(layers))


class _Toy(nn.Module):
    """Linears named as in a transformers model: ``model.layers.<i>.<proj>``."""

    def __init__(self, layers: int = 64) -> None:
        super().__init__()
        self.model = _Layers(layers)


CATASTROPHIC = ["(.|.)*_", "(.*.*)*_", ".*.*.*.*.*.*.*.*.*.*.*.*.*.*_", "(\\w+\\.?)+_"]


def test_target_modules_that_select_nothing_are_invalid_arguments_naming_the_field():
    toy = _Toy(2)
    for selector, why in (
        (["nope"], "matches no linear layer"),
        ("model\\.layers\\.\\d+\\.nope", "matches no linear layer"),
        ("(unclosed", "not a valid regular expression"),
        ("x" * 2000, "longer than"),
    ):
        with pytest.raises(InvalidArgumentError) as refused:
            resolve_target_modules(toy, selector)
        assert "target_modules" in str(refused.value) and why in str(refused.value)
    with pytest.raises(InvalidArgumentError) as refused:
        resolve_target_modules(toy, ["nope"])
    assert "q_proj" in str(refused.value)  # the message shows what the model has
    with pytest.raises(InvalidArgumentError, match="exclude_modules"):
        resolve_target_modules(toy, "all-linear", exclude_modules="(bad")
    assert resolve_target_modules(toy, ".*\\.(q|v)_proj") == [
        f"model.layers.{i}.{p}" for i in range(2) for p in ("q_proj", "v_proj")
    ]
    chosen = resolve_target_modules(toy, ["o_proj"], layers_to_transform=[1])
    assert chosen == ["model.layers.1.o_proj"]
    chosen = resolve_target_modules(
        toy, ["o_proj"], layers_to_transform=[0], layers_pattern=("layers",)
    )
    assert chosen == ["model.layers.0.o_proj"]
    with pytest.raises(InvalidArgumentError, match="layers_pattern"):
        resolve_target_modules(toy, ["o_proj"], layers_to_transform=[0], layers_pattern=("(x",))


@pytest.mark.parametrize("selector", CATASTROPHIC)
def test_a_catastrophic_regex_is_refused_within_a_bounded_time(selector):
    toy = _Toy()
    started = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match="target_modules"):
        resolve_target_modules(toy, selector)
    assert time.perf_counter() - started < 3.0


def test_bad_target_modules_over_http_are_a_400_and_create_nothing(server):
    async def scenario():
        async with client(server) as alice:
            for selector in (["nope"], "(unclosed", "(.|.)*_"):
                started = time.perf_counter()
                reply = await alice.post(
                    f"{MODEL}/add_adapter_to_model",
                    json={"adapter_name": "tm", "config": {"r": 4, "target_modules": selector}},
                )
                assert reply.status_code == 400, (selector, reply.text)
                assert "target_modules" in reply.json()["error"]
                assert time.perf_counter() - started < 5.0
            # Nothing was created: the same name is free for a valid config.
            reply = await alice.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "tm", "config": {"r": 4, "target_modules": ["q_proj"]}},
            )
            assert reply.status_code == 200, reply.text

    asyncio.run(scenario())


# --- 12. messages and log levels ---------------------------------------------------------------

INTERNAL = "aea04cb56b16807d7"
OTHER = "a0123456789abcdef"


def test_messages_name_the_tenants_adapter_not_the_internal_id():
    names = {INTERNAL: "my-lora"}
    error = from_exception(
        UnknownAdapterError(f"unknown adapter {INTERNAL!r}; adapters on this model: ['{OTHER}']"),
        names=names,
    )
    assert isinstance(error, NotFound)
    assert (
        error.message == "unknown adapter 'my-lora'; adapters on this model: ['<another adapter>']"
    )
    error = from_exception(BadRequest(f"adapter {INTERNAL!r} has no optimizer"), names=names)
    assert error.message == "adapter 'my-lora' has no optimizer"
    assert error.to_dict()["error"] == error.message
    # A name that merely looks like an id is the tenant's own: left alone without a map.
    assert from_exception(InvalidArgumentError(f"bad {OTHER}")).message == f"bad {OTHER}"


def test_a_capacity_503_says_retry_later_once():
    from twinkle.model.paging import AdapterCapacityError

    busy = from_exception(AdapterCapacityError("all 4 resident adapters are busy; retry later"))
    assert isinstance(busy, AtCapacity) and busy.message.count("retry later") == 1
    full = from_exception(AdapterCapacityError("2 adapters are paged out already (max_paged=2)"))
    assert full.message.count("retry later") == 1


def _client_gone_errors() -> list[BaseException]:
    from ray.exceptions import TaskCancelledError
    from starlette.requests import ClientDisconnect

    errors: list[BaseException] = [ClientDisconnect(), TaskCancelledError()]
    try:
        from ray.serve.exceptions import RequestCancelledError
    except ImportError:
        return errors
    return [*errors, RequestCancelledError("rid")]


@pytest.mark.parametrize("exc", _client_gone_errors(), ids=lambda e: type(e).__name__)
def test_a_client_that_went_away_is_logged_at_info_not_error(exc, caplog):
    with caplog.at_level(logging.INFO, logger="twinkle.server.web.errors"):
        error = from_exception(exc)
    assert error.status == 499 and error.category == "user"
    levels = [r.levelno for r in caplog.records if r.name == "twinkle.server.web.errors"]
    assert levels == [logging.INFO], caplog.text
    assert "went away" in caplog.text


def test_an_abandoned_request_body_logs_no_error(server, caplog):
    """The client disconnects while the server reads the body: one INFO line, no ERROR."""

    async def scenario():
        async def receive():
            return {"type": "http.disconnect"}

        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": f"{SAMPLER}/sample",
            "raw_path": f"{SAMPLER}/sample".encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"authorization", f"Bearer {KEYS['alice']}".encode())],
            "client": ("test", 1),
            "server": ("test", 80),
        }
        await server.app(scope, receive, send)
        return sent

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert any("went away" in r.getMessage() for r in caplog.records)
