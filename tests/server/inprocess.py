"""Helpers for tests that drive a whole server in-process through httpx.ASGITransport."""

from __future__ import annotations

import httpx

from twinkle.server.config import parse_config
from twinkle.server.local import build_local_server
from twinkle.server.state import MemoryStore

KEYS = {"alice": "key-alice-123", "bob": "key-bob-456"}


def config_dict(
    model_id: str = "tiny://qwen3",
    backend: str = "transformers",
    sampler: bool = False,
    server_args: dict | None = None,
    **model_args,
) -> dict:
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
    config = config_dict(**kwargs)
    config["storage"] = {"root": str(tmp_path / "storage")}
    return build_local_server(parse_config(config), store=MemoryStore("t:"))


def client(server, who: str | None = "alice", **headers) -> httpx.AsyncClient:
    if who is not None:
        headers.setdefault("Authorization", f"Bearer {KEYS[who]}")
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=server.app), base_url="http://test", headers=headers
    )
