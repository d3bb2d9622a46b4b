"""A live Twinkle server (tiny model, real HTTP on loopback) for the official Tinker SDK."""

from __future__ import annotations

import pytest
from sdk_version import adapt_creation_calls, in_process, serve_in_subprocess  # noqa: E402

from twinkle.server.testing import KEYS, config_dict, serve_in_thread

BASE_MODEL = "tiny/qwen3.5"
adapt_creation_calls()


def tinker_config(tmp_path) -> dict:
    config = config_dict(
        model_id="tiny://qwen3.5",
        sampler=True,
        max_loras=32,  # every test file of the session adds adapters for the same keys
        server_args={
            "server_config": {"per_token_model_limit": 32, "supported_models": [BASE_MODEL]}
        },
    )
    config["storage"] = {"root": str(tmp_path / "storage")}
    return config


@pytest.fixture(scope="session")
def live_server(tmp_path_factory):
    """(base_url, LocalServer) shared by the whole tests/twinkle_server/tinker session (LocalServer is None when
    the server runs in another process, under an older SDK: tests/twinkle_server/tinker/sdk_version.py)."""
    if not in_process():
        with serve_in_subprocess(tmp_path_factory.mktemp("tinker")) as url:
            yield url, None
        return
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    server = build_local_server(
        parse_config(tinker_config(tmp_path_factory.mktemp("tinker"))), store=MemoryStore("tk:")
    )
    with serve_in_thread(server.app) as url:
        yield url, server


@pytest.fixture(scope="session")
def service(live_server):
    """A ServiceClient of tenant alice (patched by init_tinker_client: plain Twinkle keys work)."""
    from twinkle_client import init_tinker_client

    init_tinker_client()
    import tinker

    client = tinker.ServiceClient(base_url=live_server[0], api_key=KEYS["alice"])
    yield client
    if hasattr(client, "close"):  # tinker>=0.33
        client.close("success").result(timeout=30)


@pytest.fixture(scope="session")
def service_bob(live_server):
    from twinkle_client import init_tinker_client

    init_tinker_client()
    import tinker

    client = tinker.ServiceClient(base_url=live_server[0], api_key=KEYS["bob"])
    yield client
    if hasattr(client, "close"):  # tinker>=0.33
        client.close("success").result(timeout=30)
