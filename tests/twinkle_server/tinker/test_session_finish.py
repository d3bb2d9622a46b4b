"""A session the SDK closes frees its adapters at once (not after adapter_timeout)."""

from __future__ import annotations

import pytest

from twinkle.server.testing import KEYS, config_dict, serve_in_thread

BASE_MODEL = "tiny/qwen3.5"

pytestmark = pytest.mark.integration


def test_closing_a_session_frees_its_slot_under_the_per_key_limit(tmp_path):
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore
    from twinkle_client import init_tinker_client

    config = config_dict(
        model_id="tiny://qwen3.5",
        server_args={
            "server_config": {"per_token_model_limit": 1, "supported_models": [BASE_MODEL]}
        },
    )
    config["storage"] = {"root": str(tmp_path / "storage")}
    server = build_local_server(parse_config(config), store=MemoryStore("fin:"))
    init_tinker_client()
    import tinker

    with serve_in_thread(server.app) as url:
        for _ in range(3):  # each script: a session, one adapter, close("success")
            service = tinker.ServiceClient(base_url=url, api_key=KEYS["alice"])
            service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)
            held = next(
                s for s in server.services.values() if hasattr(s, "adapters")
            )  # the model service
            assert len(held.adapters) == 1
            service.close("success").result(timeout=30)
            assert not held.adapters, "the closed session's adapter is still loaded"
