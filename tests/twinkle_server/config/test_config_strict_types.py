"""Integer config fields take integers only: a quoted YAML number is an error naming the field."""

from __future__ import annotations

import pytest
import yaml
from config_samples import full_config_data, tiny_config_data

from twinkle.server.config import ConfigError, load_config, parse_config


def _problems(data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


def test_a_quoted_port_in_yaml_is_refused_naming_the_field(tmp_path):
    data = tiny_config_data()
    path = tmp_path / "server.yaml"
    text = yaml.safe_dump(data).replace(f"port: {data['http_options']['port']}", 'port: "8000"')
    assert 'port: "8000"' in text
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert any(
        p.startswith("http_options.port: ") and "'8000'" in p and "without quotes" in p
        for p in info.value.problems
    ), info.value.problems


@pytest.mark.parametrize("value", ["8000", True])
def test_strings_and_booleans_are_not_integers(value):
    data = tiny_config_data()
    data["http_options"]["port"] = value
    data["applications"][1]["args"]["max_loras"] = "4"
    problems = _problems(data)
    assert any(p.startswith("http_options.port: expected an integer") for p in problems)
    assert any(
        p.startswith("applications[1].args.max_loras: expected an integer") for p in problems
    )


def test_yaml_numbers_still_load(tmp_path):
    for data in (tiny_config_data(), full_config_data()):
        path = tmp_path / "server.yaml"
        path.write_text(yaml.safe_dump(data))
        config = load_config(path)
        assert isinstance(config.http_options.port, int)
