"""A whole Twinkle server (gateway, model, sampler, processor) on a loopback port, for client tests."""

from __future__ import annotations

import contextlib
from pathlib import Path

from twinkle.server.testing import KEYS, config_dict, serve_in_thread

MODEL_ID = "tiny://qwen3"
TEMPLATE = "Qwen3Template"

__all__ = ["KEYS", "MODEL_ID", "TEMPLATE", "full_server"]


@contextlib.contextmanager
def full_server(root: Path, model_id: str = MODEL_ID, sampler: bool = True, **model_args):
    """Yields ``(base_url, local_server)``; the server stops on exit."""
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    config = config_dict(model_id=model_id, sampler=sampler, **model_args)
    config["applications"].append(
        {
            "name": "processor",
            "route_prefix": "/api/v1/processor",
            "import_path": "processor",
            "args": {},
        }
    )
    config["storage"] = {"root": str(root / "storage")}
    server = build_local_server(parse_config(config), store=MemoryStore(f"{root.name}:"))
    with serve_in_thread(server.app) as url:
        yield url, server
