"""Training calls straight to the model's replica when the server offers its address, and back to
the main address when that address does not (or no longer) answer: no call is lost."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from twinkle_client import TwinkleClient

ROUTE = "/api/v1/model/tiny/qwen3"


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _main_server(direct_url: str | None):
    """The main address: publishes its routes, offers ``direct_url`` and answers every op with
    ``"main"``; ``seen`` records every call but the route table's."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/routes":
            return httpx.Response(200, json={"models": {"tiny/qwen3": ROUTE}})
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path.endswith("/endpoint"):
            return httpx.Response(200, json={"direct_url": direct_url})
        return httpx.Response(200, json={"result": "main"})

    return httpx.MockTransport(handler), seen


class _Replica(BaseHTTPRequestHandler):
    """The replica's own port: healthy, and answers every op with ``"direct"``."""

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._reply({"status": "ok"})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        assert self.headers["Authorization"] == "Bearer k"  # the same key goes along
        self._reply({"result": "direct"})

    def log_message(self, *args) -> None:
        pass


def _client(transport, **kwargs) -> TwinkleClient:
    return TwinkleClient(
        base_url="http://main.test",
        api_key="k",
        transport=transport,
        heartbeat_interval_s=None,
        **kwargs,
    )


def test_calls_go_to_the_offered_address_and_fall_back_when_it_stops_answering():
    replica = ThreadingHTTPServer(("127.0.0.1", 0), _Replica)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    direct = f"http://127.0.0.1:{replica.server_address[1]}"
    transport, seen = _main_server(direct)
    client = _client(transport, direct=True)
    try:
        assert client.call(ROUTE, "forward_backward", {"x": 1}) == "direct"
        assert client.call(ROUTE, "clip_grad_and_step", {}) == "direct"
        assert seen == [f"GET {ROUTE}/endpoint"]  # asked once, then straight to the replica
        replica.shutdown()
        replica.server_close()
        # Refused connection: nothing was sent, so the call goes to the main address.
        assert client.call(ROUTE, "forward_backward", {"x": 2}) == "main"
        assert seen[-1] == f"POST {ROUTE}/forward_backward"
        # The next call asks again; the address still does not answer: the main address stays.
        assert client.call(ROUTE, "clip_grad_and_step", {}) == "main"
        assert client._routes[ROUTE] is client.http
    finally:
        client.close()


@pytest.mark.parametrize("offered", [None, "unreachable"])
def test_no_or_an_unreachable_address_keeps_the_main_one(offered):
    url = f"http://127.0.0.1:{_unused_port()}" if offered else None
    transport, seen = _main_server(url)
    client = _client(transport, direct=True)
    try:
        assert client.call(ROUTE, "forward_backward", {}) == "main"
        assert client.call(ROUTE, "forward_backward", {}) == "main"
        assert seen.count(f"GET {ROUTE}/endpoint") == 1
        assert client._routes[ROUTE] is client.http
    finally:
        client.close()


def test_direct_calls_can_be_turned_off(monkeypatch):
    transport, seen = _main_server("http://127.0.0.1:1")
    monkeypatch.setenv("TWINKLE_CLIENT_DIRECT", "0")
    # The environment decides for a client on a real network; a custom transport turns it off.
    assert TwinkleClient(base_url="http://main.test", heartbeat_interval_s=None)._direct is False
    monkeypatch.delenv("TWINKLE_CLIENT_DIRECT")
    client = _client(transport)
    try:
        assert client._direct is False
        assert client.call(ROUTE, "forward_backward", {}) == "main"
        assert f"GET {ROUTE}/endpoint" not in seen
    finally:
        client.close()
