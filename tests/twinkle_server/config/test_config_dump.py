"""``dump_config`` round-trips, fills defaults and masks secrets; API keys resolve from 3 sources."""

from __future__ import annotations

import json

import pytest
import yaml
from config_samples import full_config_data, tiny_config_data

from twinkle.server.config import AuthConfig, ConfigError, dump_config, parse_config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_dump_round_trips_with_keys_masked(fmt):
    config = parse_config(full_config_data())
    text = dump_config(config, format=fmt)
    data = yaml.safe_load(text) if fmt == "yaml" else json.loads(text)
    assert data["auth"]["api_keys"] == ["***"]
    assert "secret-key" not in text
    again = parse_config(data)
    assert again.model_copy(update={"auth": config.auth}) == config


def test_dump_fills_defaults():
    data = yaml.safe_load(dump_config(parse_config(tiny_config_data())))
    assert data["telemetry"]["service_name"] == "twinkle-server"
    assert data["applications"][0]["args"]["max_request_bytes"] == 8 * 1024 * 1024
    model = data["applications"][1]["args"]
    assert model["adapter_config"] == {"adapter_timeout": 1800.0, "adapter_max_lifetime": 36000.0}
    assert model["max_lora_rank"] == 64


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="format"):
        dump_config(parse_config(tiny_config_data()), format="toml")


def test_api_keys_come_from_list_file_and_env(tmp_path, monkeypatch):
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# operators\nkey-b\n\n  key-c  \nkey-a\n")
    monkeypatch.setenv("MY_KEYS", "key-d, key-a,")
    auth = AuthConfig(api_keys=["key-a"], api_keys_file=str(keys_file), api_keys_env="MY_KEYS")
    assert auth.resolve_api_keys() == ["key-a", "key-b", "key-c", "key-d"]


def test_unreadable_api_keys_file_names_the_field(tmp_path, monkeypatch):
    monkeypatch.delenv("TWINKLE_SERVER_API_KEYS", raising=False)
    auth = AuthConfig(api_keys_file=str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="auth.api_keys_file: cannot read"):
        auth.resolve_api_keys()
