"""A whole server in one process, for tests and benchmarks.

Two ways to reach it: ``client`` talks to the app in-process through ``httpx.ASGITransport`` (no
socket), and ``serve_in_thread`` runs it under uvicorn on a free loopback port, for SDKs that need
a real URL. ``config_dict`` and ``local_server`` build the tiny server both use, with the API keys
in ``KEYS``. Nothing here is imported by the server itself.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx

KEYS = {"alice": "key-alice-123", "bob": "key-bob-456"}


def config_dict(
    model_id: str = "tiny://qwen3",
    backend: str = "transformers",
    sampler: bool = False,
    server_args: dict | None = None,
    **model_args,
) -> dict:
    """A server config (the YAML's dict form): gateway and model, plus a torch sampler if asked."""
    base = model_id.replace("://", "/")
    apps = [
        {
            "name": "server",
            "route_prefix": "/api/v1",
            "import_path": "server",
            "args": {
                "server_config": {"per_token_model_limit": 3, "supported_models": [base]},
                **(server_args or {}),
            },
        },
        {
            "name": "model",
            "route_prefix": f"/api/v1/model/{base}",
            "import_path": "model",
            "args": {"backend": backend, "model_id": model_id, "max_loras": 4, **model_args},
        },
    ]
    if sampler:
        apps.append(
            {
                "name": "sampler",
                "route_prefix": f"/api/v1/sampler/{base}",
                "import_path": "sampler",
                "args": {"model_id": model_id, "sampler_type": "torch"},
            }
        )
    return {"auth": {"api_keys": list(KEYS.values())}, "applications": apps}


def local_server(tmp_path, **kwargs):
    """An in-process server of ``config_dict(**kwargs)`` storing under ``tmp_path``, state in memory."""
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    config = config_dict(**kwargs)
    config["storage"] = {"root": str(tmp_path / "storage")}
    return build_local_server(parse_config(config), store=MemoryStore("t:"))


def client(server, who: str | None = "alice", **headers) -> httpx.AsyncClient:
    """An async client of ``server``'s app in-process, authenticated as ``who`` (None: no key)."""
    if who is not None:
        headers.setdefault("Authorization", f"Bearer {KEYS[who]}")
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=server.app), base_url="http://test", headers=headers
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app, health_path: str = "/api/v1/healthz", timeout_s: float = 20.0):
    """Serve ``app`` on a free loopback port; yields the base URL; stops the server after."""
    import uvicorn

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
