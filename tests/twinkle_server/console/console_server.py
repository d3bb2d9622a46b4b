"""A live in-process server (tiny://qwen3, torch sampler) for the console tests, and the keys.

``alice`` and ``bob`` are tenants; ``admin`` is an operator key (``auth.admin_api_key_sha256``).
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from twinkle.server.config import parse_config
from twinkle.server.process.local import build_local_server
from twinkle.server.state import MemoryStore

KEYS = {"alice": "key-alice-console-1", "bob": "key-bob-console-2", "admin": "key-ops-console-3"}
BASE = "tiny/qwen3"
MODEL = f"/api/v1/model/{BASE}"
ROWS = [{"input_ids": list(range(10, 26)), "labels": list(range(10, 26))}]


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


def config(storage) -> dict:
    """Gateway, transformers model and torch sampler of tiny://qwen3, the three keys."""
    return {
        "auth": {
            "api_keys": list(KEYS.values()),
            "admin_api_key_sha256": [hashlib.sha256(KEYS["admin"].encode()).hexdigest()],
        },
        "storage": {"root": str(storage)},
        "applications": [
            {
                "name": "server",
                "route_prefix": "/api/v1",
                "import_path": "server",
                "args": {"server_config": {"per_token_model_limit": 3}},
            },
            {
                "name": "model",
                "route_prefix": MODEL,
                "import_path": "model",
                "args": {"backend": "transformers", "model_id": "tiny://qwen3", "max_loras": 4},
            },
            {
                "name": "sampler",
                "route_prefix": f"/api/v1/sampler/{BASE}",
                "import_path": "sampler",
                "args": {"model_id": "tiny://qwen3", "sampler_type": "torch", "max_length": 96},
            },
        ],
    }


@pytest.fixture(scope="package")
def server(tmp_path_factory):
    return build_local_server(
        parse_config(config(tmp_path_factory.mktemp("console") / "storage")),
        store=MemoryStore("console:"),
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="package")
def url(server):
    """The server on a loopback port (the browser needs a real socket)."""
    port = _free_port()
    uv = uvicorn.Server(
        uvicorn.Config(server.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(base + "/api/v1/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the console test server did not start"
        time.sleep(0.05)
    yield base
    uv.should_exit = True
    thread.join(timeout=10)


def train(http: httpx.Client, adapter: str, steps: int, pause_s: float = 0.0) -> None:
    """``steps`` optimizer steps of ``adapter`` (created first if needed) through the model's
    native HTTP operations."""
    for _ in range(steps):
        for op, body in [
            ("forward_backward", {"adapter_name": adapter, "inputs": ROWS}),
            ("clip_grad_and_step", {"adapter_name": adapter}),
        ]:
            response = http.post(f"{MODEL}/{op}", json=body)
            assert response.status_code == 200, response.text
        time.sleep(pause_s)


def add_adapter(http: httpx.Client, adapter: str) -> None:
    for op, body in [
        ("add_adapter_to_model", {"adapter_name": adapter, "config": {"r": 8, "lora_alpha": 32}}),
        ("set_optimizer", {"adapter_name": adapter, "optimizer": "AdamW", "lr": 5e-2}),
    ]:
        response = http.post(f"{MODEL}/{op}", json=body)
        assert response.status_code == 200, response.text


def run_of(http: httpx.Client, adapter: str) -> str:
    """The training run id of the caller's adapter."""
    runs = http.get("/api/v1/training_runs", params={"limit": 1000}).json()["training_runs"]
    status = http.get(f"{MODEL}/status").json()
    (run,) = [t["training_run_id"] for t in status["tenants"] if t["adapter_name"] == adapter]
    assert run in {r["training_run_id"] for r in runs}
    return run


def wait_for_history(http: httpx.Client, run_id: str, steps: int, timeout_s: float = 20) -> None:
    """Until the server's record of ``run_id`` holds ``steps`` points (its history writer
    stores a step a moment after the step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        history = http.get(f"/api/v1/training_runs/{run_id}/history").json()
        if history["recorded"] >= steps:
            return
        assert time.monotonic() < deadline, f"{run_id} recorded {history['recorded']} steps"
        time.sleep(0.05)


@pytest.fixture(scope="package")
def alice_run(url):
    """Alice's adapter ``ca`` trained two steps, saved as ``ca-1`` and published live; its run
    id and checkpoint path."""
    with httpx.Client(base_url=url, headers=auth("alice"), timeout=120) as http:
        add_adapter(http, "ca")
        train(http, "ca", 2)
        response = http.post(f"{MODEL}/save", json={"adapter_name": "ca", "name": "ca-1"})
        assert response.status_code == 200, response.text
        path = response.json()["result"]["path"]
        response = http.post(
            "/api/v1/publish_live_adapter", json={"base_model": BASE, "adapter_name": "ca"}
        )
        assert response.status_code == 200, response.text
        run_id = run_of(http, "ca")
        wait_for_history(http, run_id, 2)
        return run_id, path
