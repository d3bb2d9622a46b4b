"""check-config fails on everything launch would fail on: one case per check (twinkle.server.process.preflight)."""

from __future__ import annotations

import copy

import pytest
import yaml
from config_samples import tiny_config_data

from twinkle.server.config import parse_config
from twinkle.server.process import preflight
from twinkle.server.process.cli import main

pytestmark = pytest.mark.unit

KEYS = {"TWINKLE_SERVER_API_KEYS": "EMPTY_API_KEY"}


def _problems(data, environ=KEYS):
    return preflight.preflight_problems(parse_config(data), environ)


def _model(data):
    return next(a for a in data["applications"] if a["import_path"] == "model")


def _sampler(data):
    return next(a for a in data["applications"] if a["import_path"] == "sampler")


def test_the_tiny_config_with_keys_has_no_problem():
    assert _problems(tiny_config_data()) == []


@pytest.mark.parametrize(
    "auth, environ, expected",
    [
        ({}, {}, "no API key source"),
        ({"api_keys_file": "/nonexistent/keys.txt"}, {}, "does not exist on this machine"),
        ({"api_keys_env": "MY_KEYS"}, {"TWINKLE_SERVER_API_KEYS": "k"}, "MY_KEYS"),
    ],
)
def test_key_sources(auth, environ, expected):
    data = tiny_config_data()
    data["auth"] = auth
    (problem,) = _problems(data, environ)
    assert expected in problem


@pytest.mark.parametrize(
    "auth",
    [{"api_keys": ["k"]}, {"allow_anonymous": True}, {"api_key_sha256": ["0" * 64]}],
)
def test_any_key_source_is_enough(auth):
    data = tiny_config_data()
    data["auth"] = auth
    assert _problems(data, {}) == []


def test_a_keys_file_counts(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# comment\nsecret\n")
    data = tiny_config_data()
    data["auth"] = {"api_keys_file": str(keys)}
    assert _problems(data, {}) == []


def test_mock_backend_with_data_parallel():
    data = tiny_config_data()
    model = _model(data)
    model["args"]["backend"] = "mock"
    model["args"]["device_group"] = {"name": "model", "ranks": 2, "device_type": "cpu"}
    model["args"]["device_mesh"] = {"device_type": "cpu", "dp_size": 2}
    (problem,) = _problems(data)
    assert problem.startswith(f"applications[{model['name']}].args.device_mesh.dp_size")
    assert "set dp_size: 1" in problem


def _megatron_mesh_problems(mesh, ranks=2):
    data = tiny_config_data()
    model = _model(data)
    model["args"].update(backend="megatron", model_id="tiny://qwen3")
    model["args"]["device_group"] = {"name": "model", "ranks": ranks, "device_type": "cuda"}
    model["args"]["device_mesh"] = {"device_type": "cuda", **mesh}
    return [p for p in _problems(data) if ".args.device_mesh" in p]


def test_megatron_pipeline_and_dp_x_tp_worlds_are_accepted():
    # pp and dp x tp (x pp) are one world of ParallelMegatronModel ranks (megatron's dp groups).
    assert _megatron_mesh_problems({"pp_size": 2}) == []
    assert _megatron_mesh_problems({"dp_size": 2, "tp_size": 2}, ranks=4) == []
    assert _megatron_mesh_problems({"tp_size": 2, "pp_size": 2}, ranks=4) == []
    (problem,) = _megatron_mesh_problems({"pp_size": 4}, ranks=4)  # tiny qwen3: 2 layers
    assert "device_mesh.pp_size" in problem and "num_hidden_layers (2)" in problem


def test_megatron_tensor_parallel_is_accepted_where_the_shapes_divide():
    assert _megatron_mesh_problems({"tp_size": 2}) == []
    assert _megatron_mesh_problems({"dp_size": 2}) == []  # Ray replicas, each tp 1
    (problem,) = _megatron_mesh_problems({"tp_size": 4}, ranks=4)  # tiny qwen3: 2 query groups
    assert "device_mesh.tp_size" in problem and "num_key_value_heads" in problem


def _megatron_moe_problems(mesh, ranks=2):
    data = tiny_config_data()
    model = _model(data)
    model["args"].update(backend="megatron", model_id="tiny://qwen3-moe")
    model["args"]["device_group"] = {"name": "model", "ranks": ranks, "device_type": "cpu"}
    model["args"]["device_mesh"] = {"device_type": "cpu", **mesh}
    return [p for p in _problems(data) if ".args.device_mesh" in p or ".args.backend" in p]


def test_megatron_moe_is_accepted_where_built_and_refused_naming_why():
    assert _megatron_moe_problems({}) == []  # tiny Qwen3-MoE, tp 1: built
    (problem,) = _megatron_moe_problems({"tp_size": 2})
    assert "device_mesh.tp_size" in problem and "with the MoE model" in problem
    # ep over the dp ranks (megatron's layout), one world of ep ranks: built
    assert _megatron_moe_problems({"dp_size": 2, "ep_size": 2}) == []
    (problem,) = _megatron_moe_problems({"dp_size": 4, "ep_size": 2}, ranks=4)
    assert "device_mesh.ep_size: 2 with dp_size 4" in problem
    assert "dp_size == ep_size at tp = pp = 1" in problem


def test_megatron_ep_on_a_dense_model_is_refused_naming_why():
    data = tiny_config_data()
    model = _model(data)
    model["args"].update(backend="megatron", model_id="tiny://qwen3")
    model["args"]["device_group"] = {"name": "model", "ranks": 2, "device_type": "cpu"}
    model["args"]["device_mesh"] = {"device_type": "cpu", "dp_size": 2, "ep_size": 2}
    (problem,) = [p for p in _problems(data) if ".args.device_mesh" in p]
    assert "device_mesh.ep_size" in problem and "needs an MoE model" in problem


def test_megatron_without_megatron_core(monkeypatch):
    data = tiny_config_data()
    _model(data)["args"].update(backend="megatron", model_id="tiny://qwen3")
    data["applications"][0]["args"]["server_config"]["supported_models"].append("tiny/qwen3")
    _sampler(data)["args"]["model_id"] = "tiny://qwen3"
    data["applications"][0]["args"]["server_config"]["supported_models"].remove("tiny/qwen3.5")
    real = preflight._installed
    monkeypatch.setattr(
        preflight, "_installed", lambda m: False if m == "megatron.core" else real(m)
    )
    (problem,) = _problems(data)
    assert "pip install megatron-core" in problem and "backend: transformers" in problem


def test_an_architecture_the_backend_refuses():
    data = tiny_config_data()
    _model(data)["args"].update(backend="megatron", model_id="tiny://qwen3.5")
    (problem,) = _problems(data)
    assert problem.startswith(f"applications[{_model(data)['name']}].args.backend")
    assert "qwen3_5" in problem and "Use backend 'transformers'" in problem


def test_an_uncached_model_is_not_downloaded_to_check_it(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path))
    data = tiny_config_data()
    _model(data)["args"].update(backend="megatron", model_id="ms://nobody/not-cached")
    supported = data["applications"][0]["args"]["server_config"]["supported_models"]
    supported[:] = ["nobody/not-cached"]
    for app in data["applications"]:
        if app["import_path"] == "sampler":
            app["args"]["model_id"] = "ms://nobody/not-cached"
    assert _problems(data) == []  # launch downloads it; check-config does not


def test_vllm_sampler_without_vllm(monkeypatch):
    data = tiny_config_data()
    _sampler(data)["args"]["sampler_type"] = "vllm"
    monkeypatch.setattr(preflight, "_installed", lambda m: m != "vllm")
    (problem,) = _problems(data)
    name = _sampler(data)["name"]
    assert problem.startswith(f"applications[{name}].args.sampler_type")
    assert f"--set applications.{name}.args.sampler_type=torch" in problem


def test_vllm_tensor_parallel_contradiction(monkeypatch):
    data = tiny_config_data()
    sampler = _sampler(data)["args"]
    sampler.update(sampler_type="vllm", engine_args={"tensor_parallel_size": 4})
    sampler["device_group"] = {"name": "sampler", "ranks": 2, "device_type": "cuda"}
    sampler["device_mesh"] = {"device_type": "cuda", "tp_size": 2}
    monkeypatch.setattr(preflight, "_installed", lambda m: True)
    (problem,) = _problems(data)
    assert "tensor_parallel_size: 4 contradicts device_mesh.tp_size 2" in problem


def test_a_supported_model_no_application_serves():
    data = tiny_config_data()
    data["applications"][0]["args"]["server_config"]["supported_models"].append("Qwen/Qwen3-8B")
    (problem,) = _problems(data)
    assert "'Qwen/Qwen3-8B' is served by no model application" in problem


def test_check_config_prints_every_problem_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TWINKLE_SERVER_API_KEYS", raising=False)
    data = copy.deepcopy(tiny_config_data())
    data["applications"][0]["args"]["server_config"]["supported_models"].append("x/y")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["check-config", "-c", str(path)]) == 1
    err = capsys.readouterr().err
    assert "(2 problems)" in err and "no API key source" in err and "'x/y'" in err


def test_launch_refuses_the_same_config_without_starting_ray(tmp_path, monkeypatch, capsys):
    from twinkle.server.process import launch as launch_module

    monkeypatch.delenv("TWINKLE_SERVER_API_KEYS", raising=False)
    monkeypatch.setattr(launch_module, "init_ray", lambda *a: pytest.fail("Ray was started"))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config_data()))
    assert main(["launch", "-c", str(path)]) == 1
    assert "cannot launch" in capsys.readouterr().err


@pytest.mark.parametrize(
    "item, message",
    [
        ("nodot", "expected <dotted.path>=<value>"),
        ("applications.nope.args.x=1", "no entry named 'nope...'"),
        ("http_options.port.x=1", "'http_options.port' is not a section"),
    ],
)
def test_bad_overrides_are_config_errors(item, message, capsys):
    from config_samples import TINY

    assert main(["check-config", "-c", str(TINY), "--set", item]) == 1
    assert message in capsys.readouterr().err


def test_an_override_reaches_the_named_application(monkeypatch):
    from config_samples import TINY

    from twinkle.server.config import load_config

    name = next(
        a["name"] for a in tiny_config_data()["applications"] if a["import_path"] == "sampler"
    )
    config = load_config(TINY, overrides=[f"applications.{name}.args.sampler_type=mock",
                                          "http_options.port=8123"])  # fmt: skip
    assert config.application(name).args.sampler_type == "mock"
    assert config.http_options.port == 8123
