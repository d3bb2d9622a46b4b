"""Every YAML shipped in the cookbook is valid, and the tiny config serves what it promises."""

from __future__ import annotations

import pytest
from config_samples import COOKBOOK_CONFIGS, TINY

from twinkle.server.config import load_config
from twinkle.server.process.cli import main

pytestmark = pytest.mark.unit


def test_the_cookbook_ships_every_expected_config():
    names = {f"{p.parent.name}/{p.name}" for p in COOKBOOK_CONFIGS}
    assert names >= {
        "transformer/server_config.yaml",
        "transformer/server_config_e2e.yaml",
        "megatron/server_config.yaml",
        "megatron/server_config_4b.yaml",
        "mock/server_config.yaml",
        "tiny/server_config.yaml",
        "tiny/server_config_file.yaml",
    }


def _id(path):
    return f"{path.parent.name}/{path.name}"


def _vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _vllm_samplers(config):
    return [a.name for a in config.applications_of("sampler") if a.args.sampler_type == "vllm"]


@pytest.fixture
def keys_from_env(monkeypatch):
    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", "EMPTY_API_KEY")  # as the run.sh scripts do


@pytest.mark.parametrize("path", COOKBOOK_CONFIGS, ids=_id)
def test_cookbook_config_launches_or_is_refused_naming_the_fix(path, capsys, keys_from_env):
    """Every shipped YAML either passes check-config or is refused with the field and the fix."""
    config = load_config(path)
    overrides = []
    if not _vllm_installed():
        overrides = [f"applications.{n}.args.sampler_type=torch" for n in _vllm_samplers(config)]
        # The torch sampler has no tensor parallelism (server_config_4b.yaml's vLLM is tp 2).
        overrides += [
            f"applications.{a.name}.args.device_mesh.tp_size=1"
            for a in config.applications_of("sampler")
            if a.args.sampler_type == "vllm"
            and a.args.device_mesh is not None
            and a.args.device_mesh.tp_size > 1
        ]
    argv = ["check-config", "-c", str(path)] + [f"--set={o}" for o in overrides]
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith(f"OK: {len(config.applications)} applications")
    supported = set(config.server_application.args.server_config.supported_models)
    for app in config.applications_of("model") + config.applications_of("sampler"):
        assert app.args.base_model_name in supported
        assert app.route_prefix.endswith("/" + app.args.base_model_name)
    for app in config.applications:
        for deployment in app.deployments:
            assert deployment.ray_actor_options.num_cpus == 0.1


@pytest.mark.skipif(_vllm_installed(), reason="vllm is installed here: nothing to refuse")
def test_a_vllm_sampler_without_vllm_is_refused_with_the_override(capsys, keys_from_env):
    path = next(p for p in COOKBOOK_CONFIGS if _id(p) == "transformer/server_config.yaml")
    assert main(["check-config", "-c", str(path)]) == 1
    err = capsys.readouterr().err
    assert (
        "applications[sampler-Qwen3.5-4B].args.sampler_type: 'vllm' but vllm is not installed"
        in err
    )
    assert "--set applications.sampler-Qwen3.5-4B.args.sampler_type=torch" in err


def test_no_key_source_is_refused_naming_the_three_ways(capsys, monkeypatch):
    monkeypatch.delenv("TWINKLE_SERVER_API_KEYS", raising=False)
    assert main(["check-config", "-c", str(TINY)]) == 1
    err = capsys.readouterr().err
    for way in ("TWINKLE_SERVER_API_KEYS", "auth.api_keys_file", "auth.api_keys:"):
        assert way in err


def test_tiny_config_serves_the_offline_model_on_cpu():
    config = load_config(TINY)
    model = config.application("models-tiny-qwen3.5")
    assert model.route_prefix == "/api/v1/model/tiny/qwen3.5"
    assert (model.args.backend, model.args.model_id) == ("transformers", "tiny://qwen3.5")
    assert model.args.device_group.device_type == "cpu"
    sampler = config.applications_of("sampler")[0]
    assert (sampler.route_prefix, sampler.args.sampler_type) == (
        "/api/v1/sampler/tiny/qwen3.5",
        "torch",
    )
    assert config.applications_of("processor")[0].route_prefix == "/api/v1/processor"
    assert config.server_application.route_prefix == "/api/v1"
    assert config.persistence.mode == "memory"
    assert (config.http_options.host, config.http_options.port) == ("127.0.0.1", 8000)
    file_variant = load_config(TINY.with_name("server_config_file.yaml"))
    assert file_variant.persistence.mode == "file" and file_variant.persistence.file_path


def test_the_documented_example_is_valid():
    import yaml

    from twinkle.server.config import parse_config

    text = (TINY.parents[4] / "docs" / "server_config.md").read_text()
    example = text.split("## Example: the tiny CPU server")[1].split("```yaml")[1].split("```")[0]
    documented, shipped = parse_config(yaml.safe_load(example)), load_config(TINY)
    routes = [[(a.name, a.route_prefix, a.import_path) for a in c.applications]
              for c in (documented, shipped)]  # fmt: skip
    assert routes[0] == routes[1]
    assert documented.applications[1].args == shipped.applications[1].args


def test_public_surface():
    import twinkle.server.config as config

    assert set(config.__all__) == {
        name for name in vars(config) if not name.startswith("_") and name[0].isupper()
    } | {"base_model_name", "config_path", "config_to_dict", "dump_config", "load_config",
         "parse_config"}  # fmt: skip
