"""``launch``: deployment options from the YAML, readiness errors, and one real Ray Serve start."""

from __future__ import annotations

import socket
import types

import httpx
import pytest
import yaml
from config_samples import full_config_data, tiny_config_data

from twinkle.server.config import parse_config
from twinkle.server.process import launch as launch_module
from twinkle.server.process.launch import LaunchError, deployment_options, wait_until_running


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


@pytest.mark.integration
@pytest.mark.slow
def test_a_joined_cluster_is_never_taken_over_and_the_address_is_honest(monkeypatch):
    """In a Ray cluster where another server runs: a second launch of the same applications is
    refused (nothing replaced) unless told to; one whose port Serve does not serve (Serve keeps
    the HTTP options it first started with) fails saying so, instead of printing a dead URL."""
    import ray
    from ray import serve

    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", "EMPTY_API_KEY")
    for kind in launch_module.APP_BUILDERS:
        monkeypatch.setitem(launch_module.APP_BUILDERS, kind, f"{__name__}:fake_build_app")

    def config(port, suffix=""):
        data = tiny_config_data()
        data["applications"] = data["applications"][:2]
        data["http_options"]["port"] = port
        for app in data["applications"]:
            app["name"] += suffix
            if suffix:  # Serve refuses one route prefix for two applications
                app["route_prefix"] = app["route_prefix"].replace("/api/v1", "/api/b1")
            app["deployments"] = [{"name": "Fake", "ray_actor_options": {"num_cpus": 0}}]
        return parse_config(data)

    first = config(_free_port())
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, namespace="twinkle-launch-test")  # fmt: skip
    try:
        url = launch_module.deploy(first, ready_timeout_s=60)
        before = serve.status().applications["server"].last_deployed_time_s
        with pytest.raises(launch_module.LaunchError, match="already run in this Ray cluster"):
            launch_module.deploy(first, ready_timeout_s=60)
        assert serve.status().applications["server"].last_deployed_time_s == before
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        other_port = _free_port()
        with pytest.raises(launch_module.LaunchError, match="nothing answers at") as info:
            launch_module.deploy(config(other_port, "-b"), ready_timeout_s=60)
        message = str(info.value)
        assert f"127.0.0.1:{other_port}/api/b1" in message and "--address local" in message
        assert f":{first.http_options.port}" in message  # where Serve does serve
    finally:
        launch_module.shutdown()


def _cookbook(name):
    from config_samples import COOKBOOK_CONFIGS

    return next(p for p in COOKBOOK_CONFIGS if f"{p.parent.name}/{p.name}" == name)


@pytest.mark.unit
def test_every_application_reserves_its_device_group():
    from twinkle.server.config import load_config
    from twinkle.server.process.placement import worker_options

    e2e = load_config(_cookbook("transformer/server_config_e2e.yaml"))
    model, sampler = e2e.applications_of("model")[0], e2e.applications_of("sampler")[0]
    # dp_size 1: the Serve replica computes itself and holds the group's one GPU each.
    assert deployment_options(model, "ModelManagement")["ray_actor_options"]["num_gpus"] == 1
    assert deployment_options(sampler, "SamplerManagement")["ray_actor_options"]["num_gpus"] == 1
    seed = load_config(_cookbook("transformer/server_config.yaml"))
    model = seed.applications_of("model")[0]  # ranks 2, dp 2, nproc_per_node 2
    assert "num_gpus" not in deployment_options(model, "ModelManagement")["ray_actor_options"]
    assert worker_options(model) == {"num_gpus": 1.0, "nproc_per_node": 2}
    processor = seed.applications_of("processor")[0]
    assert (
        "num_gpus" not in deployment_options(processor, "ProcessorManagement")["ray_actor_options"]
    )


@pytest.mark.unit
def test_ray_actor_options_apply_on_top_of_the_group():
    data = yaml.safe_load(_cookbook("transformer/server_config_e2e.yaml").read_text())
    data["applications"][1]["deployments"][0]["ray_actor_options"]["num_gpus"] = 0.5
    config = parse_config(data)
    options = deployment_options(config.applications_of("model")[0], "ModelManagement")
    assert options["ray_actor_options"]["num_gpus"] == 0.5  # the config says share


@pytest.mark.unit
def test_vllm_tensor_parallel_comes_from_the_mesh(monkeypatch):
    from twinkle.server.sampler import deployment as sampler_deployment

    data = yaml.safe_load(_cookbook("transformer/server_config_e2e.yaml").read_text())
    sampler = data["applications"][2]["args"]
    sampler["device_group"]["ranks"] = 2
    sampler["device_mesh"]["tp_size"] = 2
    app = parse_config(data).applications_of("sampler")[0]
    built = {}

    class FakeVllm:
        def __init__(self, model_id, **kwargs):
            built.update(kwargs)

    import twinkle.sampler

    monkeypatch.setattr(twinkle.sampler, "vLLMSampler", FakeVllm, raising=False)
    sampler_deployment.create_sampler(app, "/tmp")
    assert built["engine_args"]["tensor_parallel_size"] == 2
    assert deployment_options(app, "SamplerManagement")["ray_actor_options"]["num_gpus"] == 2


@pytest.mark.unit
def test_launch_refuses_before_ray_starts(monkeypatch):
    import ray

    monkeypatch.delenv("TWINKLE_SERVER_API_KEYS", raising=False)
    monkeypatch.setattr(launch_module, "init_ray", lambda *a: pytest.fail("Ray was started"))
    with pytest.raises(LaunchError, match="no API key source"):
        launch_module.launch(parse_config(tiny_config_data()), blocking=False)
    assert not ray.is_initialized()


@pytest.mark.unit
def test_launch_hands_replicas_only_key_digests(monkeypatch):
    import hashlib

    from twinkle.server.web.auth import ApiKeyAuth

    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", "EMPTY_API_KEY,other-key")
    sealed = parse_config(tiny_config_data()).auth.sealed()
    assert sealed.api_keys == [] and sealed.api_keys_file is None
    assert sealed.api_key_sha256 == [
        hashlib.sha256(k.encode()).hexdigest() for k in ("EMPTY_API_KEY", "other-key")
    ]
    # A replica on a node without the variable accepts the same keys, as the same tenants.
    auth = ApiKeyAuth(env_var=sealed.api_keys_env, environ={}, digests=sealed.api_key_sha256)
    direct = ApiKeyAuth(keys=["EMPTY_API_KEY"], environ={})
    presented = {"Authorization": "Bearer EMPTY_API_KEY"}
    assert auth.authenticate(presented).tenant_id == direct.authenticate(presented).tenant_id
    assert auth.authenticate({"X-API-Key": "tml-other-key"}).tenant_id
    with pytest.raises(Exception, match="invalid API key"):
        auth.authenticate({"X-API-Key": "wrong"})
