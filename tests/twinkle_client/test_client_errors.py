"""Errors a user understands: unreachable server, bad keys, server messages, retries with backoff."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from twinkle_client import TwinkleClient
from twinkle_client._http import HttpTransport
from twinkle_client.errors import (
    AuthenticationError,
    BadRequestError,
    GoneError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServerUnavailableError,
    TwinkleServerError,
)


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _replies(*responses: httpx.Response):
    """A transport answering the given responses in turn, recording the requests."""
    seen: list[httpx.Request] = []
    queue = list(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return httpx.MockTransport(handler), seen


def _error(status: int, message: str, code: str = "X", **headers: str) -> httpx.Response:
    return httpx.Response(
        status, json={"error": message, "category": "user", "code": code}, headers=headers
    )


def _http(transport, api_key="k", **kw) -> tuple[HttpTransport, list[float]]:
    sleeps: list[float] = []
    return HttpTransport(
        "http://twinkle.test", api_key, transport=transport, sleep=sleeps.append, **kw
    ), sleeps


def test_a_server_that_is_down_is_named_and_reported_fast():
    url = f"http://127.0.0.1:{_unused_port()}"
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError) as info:
        TwinkleClient(base_url=url, api_key="k")
    assert url in str(info.value) and "TWINKLE_SERVER_URL" in str(info.value)
    assert time.monotonic() - start < 5
    assert info.value.status is None and info.value.category == "server"


def test_missing_and_rejected_keys_say_so():
    transport, seen = _replies(_error(401, "missing API key"))
    with pytest.raises(AuthenticationError, match="no API key was sent.*TWINKLE_SERVER_TOKEN"):
        _http(transport, api_key=None)[0].get("/api/v1/training_runs")
    assert "authorization" not in seen[0].headers
    transport, seen = _replies(_error(401, "invalid API key"))
    with pytest.raises(AuthenticationError, match="rejected the API key") as info:
        _http(transport, api_key="wrong")[0].get("/api/v1/training_runs")
    assert seen[0].headers["authorization"] == "Bearer wrong" and info.value.status == 401
    transport, _ = _replies(_error(403, "not your run"))
    with pytest.raises(PermissionDeniedError, match="not allowed.*not your run"):
        _http(transport)[0].get("/api/v1/training_runs/x")


def test_the_servers_message_is_kept_and_user_errors_are_not_retried():
    transport, seen = _replies(
        _error(404, "unknown adapter 'nope': call add_adapter_to_model first", "NotFound")
    )
    http, sleeps = _http(transport)
    with pytest.raises(NotFoundError, match="unknown adapter 'nope'") as info:
        http.post("/api/v1/model/tiny/qwen3/forward_backward", {"adapter_name": "nope"})
    assert (info.value.status, info.value.code, info.value.category) == (404, "NotFound", "user")
    assert len(seen) == 1 and sleeps == []
    transport, seen = _replies(_error(400, "bad"))
    with pytest.raises(BadRequestError):
        _http(transport)[0].post("/x", {})
    assert len(seen) == 1


def test_429_is_retried_honouring_retry_after():
    transport, seen = _replies(
        _error(429, "slow down", **{"Retry-After": "3"}), httpx.Response(200, json={"ok": 1})
    )
    http, sleeps = _http(transport)
    assert http.post("/x", {}) == {"ok": 1}
    assert len(seen) == 2 and sleeps == [3.0]


def test_503_backs_off_exponentially_then_gives_up():
    transport, seen = _replies(_error(503, "at capacity"))
    http, sleeps = _http(transport, max_retries=3, backoff_s=0.5)
    with pytest.raises(ServerUnavailableError, match="at capacity") as info:
        http.post("/x", {})
    assert sleeps == [0.5, 1.0, 2.0] and len(seen) == 4 and info.value.status == 503
    transport, _ = _replies(_error(429, "over the limit"))
    with pytest.raises(RateLimitError):
        _http(transport, max_retries=1)[0].post("/x", {})


def test_timeouts_are_deadlines_with_advice():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    with pytest.raises(ServerUnavailableError, match="timed out.*timeout="):
        _http(httpx.MockTransport(handler))[0].post("/x", {})
    http, _ = _http(httpx.MockTransport(handler), timeout=12.0, connect_timeout=3.0)
    assert http._http.timeout == httpx.Timeout(12.0, connect=3.0)


def test_every_error_is_a_twinkle_server_error():
    for cls in (
        AuthenticationError,
        NotFoundError,
        RateLimitError,
        ServerUnavailableError,
        BadRequestError,
    ):
        assert issubclass(cls, TwinkleServerError)


def test_a_lost_adapter_is_a_gone_error_and_still_a_not_found_error():
    message = "adapter 'a' was lost: the model server restarted; resume from its newest checkpoint"
    transport, seen = _replies(_error(410, message, code="Gone"))
    http, _ = _http(transport)
    with pytest.raises(GoneError, match="was lost") as info:
        http.post("/models/m/forward_backward", {})
    assert isinstance(info.value, NotFoundError) and info.value.status == 410
    assert len(seen) == 1  # a user error: not retried
