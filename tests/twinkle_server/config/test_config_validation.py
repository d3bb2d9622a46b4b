"""Strict validation: unknown keys, wrong types and cross-field problems name the dotted path."""

from __future__ import annotations

import copy
import logging
import typing

import pytest
from config_samples import full_config_data, tiny_config_data
from pydantic import BaseModel

from twinkle.server.config import (
    ConfigError,
    ModelArgs,
    SamplerArgs,
    ServerConfig,
    base_model_name,
    load_config,
    parse_config,
)

pytestmark = pytest.mark.unit


def _problems(data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


def _reachable_models(model: type[BaseModel]) -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()

    def visit(annotation):
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in found:
                found.add(annotation)
                for field in annotation.model_fields.values():
                    visit(field.annotation)
        for arg in typing.get_args(annotation):
            visit(arg)

    visit(model)
    return found


def _model_dicts(instance: BaseModel, data: dict, loc: tuple = ()):
    """Yield ``(loc, data dict, model class)`` for every model in the validated tree."""
    yield loc, data, type(instance)
    for name in type(instance).model_fields:
        value = getattr(instance, name)
        if isinstance(value, BaseModel):
            yield from _model_dicts(value, data[name], (*loc, name))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _model_dicts(item, data[name][i], (*loc, name, i))


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def test_every_model_rejects_an_unknown_key_by_its_dotted_path():
    data = full_config_data()
    config = parse_config(data)
    sites = list(_model_dicts(config, data))
    assert {cls for _, _, cls in sites} == _reachable_models(ServerConfig)  # every model visited
    for loc, _, cls in sites:
        broken = copy.deepcopy(data)
        target = broken
        for part in loc:
            target = target[part]
        target["zz_typo"] = 1
        path = f"{_dotted(loc)}.zz_typo" if loc else "zz_typo"
        assert f"{path}: unknown field" in _problems(broken), cls.__name__


def test_a_typo_message_names_the_file_and_the_path(tmp_path):
    data = tiny_config_data()
    data["applications"][1]["args"]["queue_config"] = {"rps_limt": 3}
    path = tmp_path / "bad.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "applications[1].args.queue_config.rps_limt: unknown field" in str(info.value)
    assert str(path) in str(info.value)


def test_wrong_types_are_rejected():
    data = tiny_config_data()
    data["http_options"]["port"] = "abc"
    data["applications"][1]["args"]["max_loras"] = "many"
    problems = _problems(data)
    assert any(p.startswith("http_options.port: ") and "integer" in p for p in problems)
    assert any(p.startswith("applications[1].args.max_loras: ") for p in problems)


@pytest.mark.parametrize(
    ("persistence", "field"),
    [({"mode": "redis"}, "redis_url"), ({"mode": "file"}, "file_path")],
)
def test_persistence_needs_its_location(persistence, field):
    data = tiny_config_data()
    data["persistence"] = persistence
    assert f"persistence.{field}: required when mode is '{persistence['mode']}'" in _problems(data)


def test_use_megatron_is_migrated_with_a_warning(caplog):
    data = tiny_config_data()
    data["applications"][1]["args"].pop("backend")
    data["applications"][1]["args"]["use_megatron"] = True
    with caplog.at_level(logging.WARNING, logger="twinkle.server.config"):
        config = parse_config(data)
    assert config.applications[1].args.backend == "megatron"
    assert "use_megatron is deprecated" in caplog.text


def test_use_megatron_contradicting_backend_is_an_error():
    data = tiny_config_data()
    data["applications"][1]["args"]["use_megatron"] = True  # backend: transformers
    (problem,) = _problems(data)
    assert problem.startswith("applications[1].args.use_megatron: True contradicts backend")


def test_max_loras_inside_adapter_config_moves_up(caplog):
    data = tiny_config_data()
    args = data["applications"][1]["args"]
    args.pop("max_loras")
    args["adapter_config"] = {"adapter_timeout": 60, "max_loras": 3}
    with caplog.at_level(logging.WARNING, logger="twinkle.server.config"):
        model = parse_config(data).applications[1].args
    assert (model.max_loras, model.adapter_config.adapter_timeout) == (3, 60)
    assert "adapter_config.max_loras" in caplog.text
    args["max_loras"] = 4
    (problem,) = _problems(data)
    assert problem == "applications[1].args.adapter_config.max_loras: 3 contradicts max_loras 4"


@pytest.mark.parametrize("size", ["tp_size", "pp_size", "ep_size"])
def test_model_parallelism_beyond_dp_needs_megatron(size):
    data = full_config_data()
    args = data["applications"][1]["args"]
    args["backend"] = "transformers"
    args["device_group"]["ranks"] = 8
    args["device_mesh"][size] = 2
    (problem,) = _problems(data)
    assert problem.startswith(f"applications[1].args.device_mesh.{size}: 2 > 1 needs backend")
    args["backend"] = "megatron"
    assert parse_config(data).applications[1].args.device_mesh.world_size >= 2


def test_mesh_larger_than_the_gpu_group_is_rejected():
    data = full_config_data()
    data["applications"][1]["args"]["device_mesh"]["dp_size"] = 4  # ranks: 2
    (problem,) = _problems(data)
    assert problem.startswith("applications[1].args.device_mesh: dp_size*tp_size*pp_size")
    assert "device_group.ranks = 2" in problem


def test_cpu_groups_are_not_counted_and_device_type_case_is_normalised():
    data = full_config_data()
    processor = parse_config(data).applications[3].args  # ranks 2, dp 2, device_type CPU
    assert processor.device_group.device_type == processor.device_mesh.device_type == "cpu"


def test_duplicate_names_and_route_prefixes_are_rejected():
    data = tiny_config_data()
    data["applications"][2]["name"] = data["applications"][1]["name"]
    data["applications"][3]["route_prefix"] = "/api/v1"
    problems = _problems(data)
    assert "applications[2].name: 'models-tiny-qwen3.5' is already used by applications[1]" in (
        problems
    )
    assert "applications[3].route_prefix: '/api/v1' is already used by applications[0]" in problems


def test_exactly_one_server_application():
    data = tiny_config_data()
    data["applications"] = data["applications"][1:]
    assert any("exactly one application with import_path 'server'" in p for p in _problems(data))


def test_route_prefix_must_start_with_a_slash():
    data = tiny_config_data()
    data["applications"][0]["route_prefix"] = "api/v1"
    assert _problems(data) == ["applications[0].route_prefix: must start with '/' (got 'api/v1')"]


def test_args_are_validated_by_import_path():
    data = tiny_config_data()
    data["applications"][3]["args"] = {"model_id": "tiny://qwen3.5"}  # processor
    assert _problems(data) == ["applications[3].args.model_id: unknown field"]
    data["applications"][1]["args"].pop("model_id")
    assert "applications[1].args.model_id: field required" in _problems(data)


def test_replicas_and_autoscaling_are_exclusive():
    data = full_config_data()
    data["applications"][0]["deployments"][0]["num_replicas"] = 2
    assert _problems(data) == [
        "applications[0].deployments[0].num_replicas: "
        "set either num_replicas or autoscaling_config, not both"
    ]


def test_env_var_numbers_become_strings():
    data = tiny_config_data()
    data["applications"][1]["deployments"][0]["runtime_env"] = {
        "env_vars": {"TWINKLE_TRUST_REMOTE_CODE": 0}
    }
    deployment = parse_config(data).applications[1].deployments[0]
    assert deployment.runtime_env.env_vars == {"TWINKLE_TRUST_REMOTE_CODE": "0"}


def test_non_mapping_and_missing_files_are_config_errors(tmp_path, monkeypatch):
    assert _problems([1, 2]) == ["<root>: expected a mapping of config fields, got list"]
    monkeypatch.delenv("TWINKLE_SERVER_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="TWINKLE_SERVER_CONFIG"):
        load_config()
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "broken.yaml")


@pytest.mark.parametrize(
    ("model_id", "name"),
    [
        ("ms://Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-4B"),
        ("hf://Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-4B"),
        ("tiny://qwen3.5", "tiny/qwen3.5"),
        ("Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-4B"),
        ("/models/Qwen3.5-4B/", "Qwen3.5-4B"),
    ],
)
def test_base_model_name(model_id, name):
    assert base_model_name(model_id) == name
    assert ModelArgs(model_id=model_id).base_model_name == name
    assert SamplerArgs(model_id=model_id).base_model_name == name


def test_config_error_is_a_value_error_listing_every_problem():
    error = ConfigError(["a.b: unknown field", "c: field required"], source="x.yaml")
    assert isinstance(error, ValueError)
    assert str(error).splitlines() == [
        "2 problems with the server config in x.yaml:",
        "  a.b: unknown field",
        "  c: field required",
    ]
