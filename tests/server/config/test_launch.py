"""``launch``: deployment options from the YAML, readiness errors, and one real Ray Serve start."""

from __future__ import annotations

import socket
import types

import httpx
import pytest
from config_samples import full_config_data, tiny_config_data

from twinkle.server import launch as launch_module
from twinkle.server.config import parse_config
from twinkle.server.launch import LaunchError, deployment_options, wait_until_running


@pytest.mark.unit
def test_deployment_options_from_the_yaml(monkeypatch):
    monkeypatch.delenv("TWINKLE_TRUST_REMOTE_CODE", raising=False)
    server = parse_config(full_config_data()).applications[0]
    assert deployment_options(server, "TinkerCompatServer") == {
        "name": "TinkerCompatServer",
        "max_ongoing_requests": 50,
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": 1,
            "target_ongoing_requests": 128.0,
        },
        "ray_actor_options": {
            "num_cpus": 0.1,
            "num_gpus": 0.0,
            "memory": 1024,
            "resources": {"head": 0.1},
            "runtime_env": {"pip": ["x"], "working_dir": ".", "env_vars": {"B": "2", "A": "1"}},
        },
    }


@pytest.mark.unit
def test_deployment_options_defaults_and_trust_remote_code(monkeypatch):
    monkeypatch.setenv("TWINKLE_TRUST_REMOTE_CODE", "1")
    data = tiny_config_data()
    data["applications"][1]["deployments"] = []
    data["applications"][2]["deployments"][0]["runtime_env"] = {
        "env_vars": {"TWINKLE_TRUST_REMOTE_CODE": "0"}
    }
    config = parse_config(data)
    model = deployment_options(config.applications[1], "ModelManagement")
    assert model["ray_actor_options"] == {
        "num_cpus": 0.1,
        "runtime_env": {"env_vars": {"TWINKLE_TRUST_REMOTE_CODE": "1"}},
    }
    assert model["max_ongoing_requests"] == launch_module.DEFAULT_MAX_ONGOING_REQUESTS["model"]
    sampler = deployment_options(config.applications[2], "SamplerManagement")
    assert sampler["ray_actor_options"]["runtime_env"]["env_vars"] == {
        "TWINKLE_TRUST_REMOTE_CODE": "0"  # the YAML wins over the launcher's environment
    }


@pytest.mark.unit
def test_deployment_options_single_entry_and_unknown_name():
    data = tiny_config_data()
    app = parse_config(data).applications[0]
    assert deployment_options(app, "OtherName")["name"] == "TinkerCompatServer"
    data["applications"][0]["deployments"].append({"name": "Second"})
    app = parse_config(data).applications[0]
    with pytest.raises(LaunchError, match="no deployment 'OtherName'.*TinkerCompatServer, Second"):
        deployment_options(app, "OtherName")


def _status(state: str, message: str = "") -> types.SimpleNamespace:
    deployment = types.SimpleNamespace(message="replica failed to start" if message else "")
    return types.SimpleNamespace(status=state, message=message, deployments={"D": deployment})


@pytest.mark.unit
def test_wait_until_running_names_the_failed_app(monkeypatch):
    from ray import serve

    apps = {"server": _status("RUNNING"), "model": _status("DEPLOY_FAILED", "boom")}
    monkeypatch.setattr(serve, "status", lambda: types.SimpleNamespace(applications=apps))
    with pytest.raises(LaunchError, match="'model' is DEPLOY_FAILED: boom; D: replica failed"):
        wait_until_running(["server", "model"], timeout_s=5)


@pytest.mark.unit
def test_wait_until_running_deadline_names_the_pending_app(monkeypatch):
    from ray import serve

    apps = {"server": _status("RUNNING"), "model": _status("DEPLOYING")}
    monkeypatch.setattr(serve, "status", lambda: types.SimpleNamespace(applications=apps))
    with pytest.raises(LaunchError, match=r"not running after 0 s: 'model' \(DEPLOYING"):
        wait_until_running(["server", "model"], timeout_s=0.0, poll_s=0.01)


@pytest.mark.unit
def test_unknown_builder_module_is_a_launch_error(monkeypatch):
    monkeypatch.setitem(launch_module.APP_BUILDERS, "server", "twinkle_no_such_module:build_app")
    with pytest.raises(LaunchError, match="cannot load the 'server' builder"):
        launch_module.resolve_builder("server")


def fake_build_app(app_config, server_config):
    """A trivial FastAPI ingress per application, sized by ``deployment_options``."""
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()

    @api.get("/healthz")
    def healthz() -> dict:
        return {"app": app_config.name}

    # Defined in the function so that Ray pickles it by value (workers cannot import tests).
    @serve.deployment
    @serve.ingress(api)
    class Fake:
        pass

    return Fake.options(**deployment_options(app_config, "Fake")).bind()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.integration
def test_launch_serves_every_application_over_http(monkeypatch):
    import ray

    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", "EMPTY_API_KEY")
    data = tiny_config_data()
    data["applications"] = data["applications"][:2]
    data["http_options"]["port"] = _free_port()
    for app in data["applications"]:
        app["deployments"] = [{"name": "Fake", "ray_actor_options": {"num_cpus": 0}}]
    config = parse_config(data)
    for kind in launch_module.APP_BUILDERS:
        monkeypatch.setitem(launch_module.APP_BUILDERS, kind, f"{__name__}:fake_build_app")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        namespace="twinkle-launch-test",
    )
    try:
        url = launch_module.launch(config, blocking=False, ready_timeout_s=60)
        assert url == f"http://127.0.0.1:{config.http_options.port}/api/v1"
        server = httpx.get(f"{url}/healthz", timeout=10)
        model = httpx.get(
            f"http://127.0.0.1:{config.http_options.port}/api/v1/model/tiny/qwen3.5/healthz",
            timeout=10,
        )
    finally:
        launch_module.shutdown()
    assert (server.status_code, server.json()) == (200, {"app": "server"})
    assert (model.status_code, model.json()) == (200, {"app": "models-tiny-qwen3.5"})
    assert not ray.is_initialized()
