"""The server config the cookbook recipes run against (quick: no server, no cookbook venv)."""

from __future__ import annotations

import pytest
from recipe_server import MAX_LENGTH, MODEL_NAME, write_server_config

pytestmark = pytest.mark.unit


def test_server_config_serves_the_registry_name(tmp_path):
    from twinkle.server.config import load_config

    write_server_config(tmp_path / "c.yaml", port=8123)
    config = load_config(str(tmp_path / "c.yaml"))
    models = [app.args for app in config.applications if hasattr(app.args, "max_length")]
    assert [args.model_id for args in models] == [f"ms://{MODEL_NAME}"] * 2
    assert all(args.max_length == MAX_LENGTH for args in models)
