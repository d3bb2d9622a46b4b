"""A real HTTP server on 127.0.0.1 for SDK tests: the in-process app under uvicorn in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import uvicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app, health_path: str = "/api/v1/healthz", timeout_s: float = 20.0):
    """Serve ``app`` on a free loopback port; yields the base URL; stops the server after."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + health_path, timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"server at {url} did not become healthy within {timeout_s} s")
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
