"""One error mapping for every app: 4xx only for explicit user mistakes, 5xx with a request id."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from twinkle import errors as lib
from twinkle.server.state import MemoryStore, ServerState
from twinkle.server.state import errors as state_errors
from twinkle.server.testing import client, local_server
from twinkle.server.tinker.futures import TinkerFutures
from twinkle.server.web import errors
from twinkle.server.web.auth import MISSING_KEY, AuthError
from twinkle.server.web.http import install_error_handlers

MODEL = "/api/v1/model/tiny/qwen3"


class OutOfMemoryError(RuntimeError):
    """Named like ``torch.OutOfMemoryError``: detected by name, without importing torch."""


class _Strict(BaseModel):
    n: int


def _validation_error() -> Exception:
    try:
        _Strict.model_validate({"n": "many"})
    except Exception as exc:  # noqa: BLE001 - the pydantic error itself is the fixture
        return exc
    raise AssertionError("pydantic accepted a bad value")


# name -> (exception to raise, expected status, category, code)
USER_ERRORS = {
    "bad_request": (errors.BadRequest("bad"), 400, "user", "BadRequest"),
    "unauthorized": (errors.Unauthorized("who"), 401, "user", "Unauthorized"),
    "forbidden": (errors.Forbidden("no"), 403, "user", "Forbidden"),
    "not_found": (errors.NotFound("gone"), 404, "user", "NotFound"),
    "conflict": (errors.Conflict("twice"), 409, "user", "Conflict"),
    "gone": (errors.Gone("finished"), 410, "user", "Gone"),
    "too_large": (errors.PayloadTooLarge("big"), 413, "user", "PayloadTooLarge"),
    "state_bad_request": (state_errors.BadRequestError("bad name"), 400, "user", "BadRequest"),
    "state_forbidden": (state_errors.ForbiddenError("outside"), 403, "user", "Forbidden"),
    "state_not_found": (state_errors.NotFoundError("no run"), 404, "user", "NotFound"),
    "state_conflict": (state_errors.ConflictError("exists"), 409, "user", "Conflict"),
    "state_gone": (state_errors.GoneError("finished"), 410, "user", "Gone"),
    "auth": (AuthError(401, MISSING_KEY), 401, "user", "Unauthorized"),
    "invalid_argument": (lib.InvalidArgumentError("r must be > 0"), 400, "user", "BadRequest"),
    "argument_type": (lib.ArgumentTypeError("unexpected arguments: x"), 400, "user", "BadRequest"),
    "state_order": (lib.StateOrderError("call forward first"), 400, "user", "BadRequest"),
    "unknown_adapter": (lib.UnknownAdapterError("unknown adapter 'a'"), 404, "user", "NotFound"),
    "path_not_found": (lib.PathNotFoundError("no adapter here"), 404, "user", "NotFound"),
    "path_forbidden": (lib.PathForbiddenError("outside"), 403, "user", "Forbidden"),
    "pydantic": (_validation_error(), 400, "user", "BadRequest"),
}
UNEXPECTED = {
    "runtime": RuntimeError("shape mismatch in matmul"),
    "type": TypeError("'NoneType' object is not subscriptable"),
    "key": KeyError("weight"),
    "value": ValueError("math domain error"),
    "file_not_found": FileNotFoundError("/srv/cache/missing"),
}
OUT_OF_MEMORY = {
    "torch_named": OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    "memory": MemoryError(),
    "cuda_message": RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"),
}
RAISES = {
    **{k: v[0] for k, v in USER_ERRORS.items()},
    **UNEXPECTED,
    **{f"oom_{k}": v for k, v in OUT_OF_MEMORY.items()},
}


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/raise/{name}")
    async def raise_it(name: str):
        raise RAISES[name]

    @app.get("/typed")
    async def typed(n: int):
        return {"n": n}

    return app


async def _get(path: str, **headers) -> httpx.Response:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await http.get(path, headers=headers)


@pytest.mark.parametrize("name", sorted(USER_ERRORS))
def test_user_errors_keep_their_4xx_and_carry_the_request_id(name, caplog):
    _, status, category, code = USER_ERRORS[name]
    with caplog.at_level(logging.ERROR, logger="twinkle"):
        r = asyncio.run(_get(f"/raise/{name}"))
    body = r.json()
    assert (r.status_code, body["category"], body["code"]) == (status, category, code), r.text
    assert body["request_id"] == r.headers["x-request-id"]
    assert not caplog.records, "a user mistake is not logged as a server error"


@pytest.mark.parametrize("name", sorted(UNEXPECTED))
def test_unexpected_errors_are_500_with_a_logged_request_id(name, caplog):
    with caplog.at_level(logging.ERROR, logger="twinkle"):
        r = asyncio.run(_get(f"/raise/{name}"))
    body = r.json()
    assert (r.status_code, body["category"], body["code"]) == (500, "server", "InternalError")
    rid = body["request_id"]
    assert rid == r.headers["x-request-id"]
    assert body["error"] == f"internal server error (request id {rid})"
    assert "Traceback" not in r.text and str(UNEXPECTED[name]).strip("'") not in r.text
    logged = [rec for rec in caplog.records if rid in rec.getMessage()]
    assert logged and logged[0].exc_info is not None, "the traceback is logged with the id"


@pytest.mark.parametrize("name", sorted(OUT_OF_MEMORY))
def test_out_of_memory_is_503_with_retry_after(name, caplog):
    with caplog.at_level(logging.ERROR, logger="twinkle"):
        r = asyncio.run(_get(f"/raise/oom_{name}"))
    body = r.json()
    assert (r.status_code, body["category"], body["code"]) == (503, "server", "OutOfMemory")
    assert int(r.headers["retry-after"]) >= 1
    assert body["request_id"] in body["error"]
    assert any(body["request_id"] in rec.getMessage() for rec in caplog.records)


def test_a_request_id_the_caller_sent_is_used_and_not_echoed_twice():
    r = asyncio.run(_get("/raise/runtime", **{"X-Request-ID": "proxy-id-123"}))
    assert r.json()["request_id"] == "proxy-id-123"
    assert "x-request-id" not in r.headers  # the Serve proxy adds it to the response itself
    r = asyncio.run(_get("/raise/runtime", **{"X-Request-ID": "bad id\nwith newline"}))
    assert r.json()["request_id"] != "bad id\nwith newline"


def test_fastapi_parameter_validation_is_400():
    r = asyncio.run(_get("/typed?n=many"))
    assert (r.status_code, r.json()["category"], r.json()["code"]) == (400, "user", "BadRequest")
    assert r.json()["request_id"] == r.headers["x-request-id"]


def test_one_hierarchy():
    for cls in (state_errors.StateError, AuthError, state_errors.NotFoundError):
        assert issubclass(cls, errors.ServiceError)
    assert state_errors.NotFoundError.status_code == state_errors.NotFoundError.status == 404
    assert AuthError(401, "x").to_dict()["code"] == "Unauthorized"
    assert issubclass(lib.UnknownAdapterError, (ValueError, KeyError))
    assert issubclass(lib.StateOrderError, RuntimeError)
    assert issubclass(errors.OutOfMemory, errors.AtCapacity)


def test_a_model_failure_through_the_served_app_names_the_logged_request_id(
    tmp_path, monkeypatch, caplog
):
    server = local_server(tmp_path)
    service = next(iter(server.services.values()))

    async def explode(*args, **kwargs):
        raise RuntimeError("index 7 is out of bounds")

    async def scenario():
        async with client(server, "alice") as alice:
            r = await alice.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "default", "config": {"r": 4}},
            )
            assert r.status_code == 200, r.text
            monkeypatch.setattr(service.scheduler, "submit", explode)
            return await alice.post(
                f"{MODEL}/forward_backward", json={"inputs": [{"input_ids": [1, 2, 3, 4]}]}
            )

    with caplog.at_level(logging.ERROR, logger="twinkle"):
        r = asyncio.run(scenario())
    body = r.json()
    assert (r.status_code, body["category"]) == (500, "server"), r.text
    assert body["request_id"] == r.headers["x-request-id"]
    assert "out of bounds" not in r.text
    assert any(body["request_id"] in rec.getMessage() and rec.exc_info for rec in caplog.records)


def test_a_tinker_future_that_ran_out_of_memory_pauses_for_capacity_then_runs(monkeypatch):
    monkeypatch.setattr(errors, "OUT_OF_MEMORY_RETRY_S", 0.05)
    state = ServerState(MemoryStore("oom:"))
    calls = []

    async def runner():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise OutOfMemoryError("CUDA out of memory")
        return {"loss": 1.0}

    async def scenario():
        futures = TinkerFutures(state)
        rid = futures.submit("alice", "forward_backward", runner, model_id="m1", seq_id=1)
        seen, deadline = set(), time.monotonic() + 10
        while time.monotonic() < deadline:
            record = state.get_future("alice", rid)
            seen.add(record.queue_state)
            if record.status != "pending":
                break
            await asyncio.sleep(0.01)
        await futures.close()
        return seen, state.get_future("alice", rid)

    seen, record = asyncio.run(scenario())
    assert "paused_capacity" in seen  # what retrieve_future reports as try_again's queue_state
    assert (record.status, record.result) == ("done", {"loss": 1.0})


def test_a_tinker_future_out_of_memory_past_its_retry_budget_fails_as_server(monkeypatch):
    monkeypatch.setattr(errors, "OUT_OF_MEMORY_RETRY_S", 0.05)
    state = ServerState(MemoryStore("oom2:"))

    async def runner():
        raise MemoryError()

    async def scenario():
        futures = TinkerFutures(state, max_retry_s=0.0)
        rid = futures.submit("alice", "forward_backward", runner, model_id="m1")
        record = await futures.wait("alice", rid, timeout=10)
        await futures.close()
        return rid, record

    rid, record = asyncio.run(scenario())
    assert (record.status, record.error.category) == ("error", "server")
    assert rid in record.error.message


def test_tinker_sdk_accepts_the_paused_capacity_state():
    module = pytest.importorskip("tinker.types.try_again_response")
    reply = {"type": "try_again", "request_id": "req-1", "queue_state": "paused_capacity"}
    assert module.TryAgainResponse.model_validate(reply).queue_state == "paused_capacity"
