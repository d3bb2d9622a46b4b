"""ModelScope Twinkle's server YAML layout: migrated to ours with a notice per field, still strict.

The YAML below copies the shapes of their cookbook configs (megatron, transformer, mock and the
documented example), not the files themselves.
"""

from __future__ import annotations

import logging
import textwrap

import pytest
import yaml

from twinkle.server.config import ConfigError, parse_config
from twinkle.server.process.cli import main

pytestmark = pytest.mark.unit

UPSTREAM_SHAPE = """
ray_namespace: twinkle_cluster
proxy_location: EveryNode
http_options: {host: 0.0.0.0, port: 9000}
telemetry: {enabled: false, otlp_endpoint: "http://localhost:4317"}
persistence: {mode: memory}
task_queue:
  rps_limit: 50.0
  tps_limit: 16000.0
  window_seconds: 1.0
  queue_timeout: 300.0
  execution_timeout: 120.0
  enabled: true
  max_input_tokens: 4096
applications:
  - name: server
    route_prefix: /api/v1
    import_path: server
    args:
      server_config: {per_token_model_limit: 3}
      supported_models: [Qwen/Qwen3.5-4B]
    deployments:
      - name: GatewayServer
        max_ongoing_requests: 50
        autoscaling_config: {min_replicas: 1, max_replicas: 1, target_ongoing_requests: 128}
        ray_actor_options: {num_cpus: 0.1}
  - name: models-Qwen3.5-4B
    route_prefix: /api/v1/model/Qwen/Qwen3.5-4B
    import_path: model
    args:
      backend: megatron
      model_id: "ms://Qwen/Qwen3.5-4B"
      max_length: 10240
      nproc_per_node: 4
      device_group: {name: model, ranks: [0, 1, 2, 3], device_type: GPU}
      device_mesh: {device_type: cuda, dp_size: 2, pp_size: 2}
      queue_config: {rps_limit: 20, tps_limit: 131072, max_input_tokens: 32768}
      adapter_config: {adapter_timeout: 120, adapter_max_lifetime: 36000}
      max_loras: 3
    deployments:
      - name: ModelManagement
        ray_actor_options:
          num_cpus: 0.1
          runtime_env: {env_vars: {TWINKLE_TRUST_REMOTE_CODE: "0"}}
  - name: sampler-Qwen3.5-4B
    route_prefix: /api/v1/sampler/Qwen/Qwen3.5-4B
    import_path: sampler
    args:
      model_id: "ms://Qwen/Qwen3.5-4B"
      nproc_per_node: 4
      sampler_type: vllm
      engine_args: {max_model_len: 4096, enable_lora: true}
      device_group: {name: sampler, gpus_per_worker: 2, ranks: 4, device_type: cuda}
      device_mesh: {device_type: cuda, dp_size: 2, tp_size: 2}
      queue_config: {rps_limit: 100, enabled: false}
  - name: processor
    route_prefix: /api/v1/processor
    import_path: processor
    args:
      ncpu_proc_per_node: 2
      device_group: {name: model, ranks: 2, device_type: CPU}
      device_mesh: {device_type: CPU, dp_size: 2}
      queue_config: {rps_limit: 10}
"""


def _data() -> dict:
    return yaml.safe_load(UPSTREAM_SHAPE)


def _problems(data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


def test_upstream_layout_is_read_into_ours_with_values(caplog):
    with caplog.at_level(logging.WARNING, logger="twinkle.server.config"):
        config = parse_config(_data())
    server, model, sampler, processor = (app.args for app in config.applications)
    assert config.ray_namespace == "twinkle_cluster"
    assert server.server_config.supported_models == ["Qwen/Qwen3.5-4B"]
    assert server.server_config.per_token_model_limit == 3
    # ranks [0..3] -> 4 devices; GPU -> cuda.
    assert (model.device_group.ranks, model.device_group.device_type) == (4, "cuda")
    assert (model.device_mesh.dp_size, model.device_mesh.pp_size) == (2, 2)
    # task_queue fills what the app's own queue_config leaves out; the app's own values win.
    queue = model.queue_config
    assert (queue.rps_limit, queue.tps_limit, queue.max_input_tokens) == (20, 131072, 32768)
    # enabled: false turns the sampler's rate limits off; max_input_tokens still from task_queue.
    queue = sampler.queue_config
    assert (queue.rps_limit, queue.tps_limit, queue.max_input_tokens) == (None, None, 4096)
    assert sampler.device_group.ranks == 4 and sampler.device_mesh.tp_size == 2
    assert processor.device_group.device_type == "cpu"
    for phrase in (
        "args.supported_models belongs in args.server_config",
        "gpus_per_worker is derived from the device mesh",
        "ranks [0, 1, 2, 3] is a list of device indices: read as ranks: 4",
        "device_type 'GPU' is read as 'cuda'",
        "task_queue is read as the default queue_config",
        "queue_config.window_seconds has no counterpart here",
        "queue_config.queue_timeout has no counterpart here",
        "queue_config.execution_timeout has no counterpart here",
        "queue_config.enabled: false: read as no rps_limit and no tps_limit",
        "processor args.queue_config",
    ):
        assert phrase in caplog.text, phrase


def test_task_queue_without_own_queue_config_is_the_default():
    data = _data()
    data["applications"][1]["args"].pop("queue_config")
    model = parse_config(data).applications[1].args
    assert (model.queue_config.rps_limit, model.queue_config.tps_limit) == (50.0, 16000.0)
    assert model.queue_config.max_input_tokens == 4096


def test_normalised_dump_has_only_our_layout():
    from twinkle.server.config import config_to_dict

    dumped = config_to_dict(parse_config(_data()))
    assert "task_queue" not in dumped
    server_args = dumped["applications"][0]["args"]
    assert "supported_models" not in server_args
    assert server_args["server_config"]["supported_models"] == ["Qwen/Qwen3.5-4B"]
    assert "gpus_per_worker" not in dumped["applications"][2]["args"]["device_group"]
    # The dump reads back without a migration.
    assert parse_config(dumped) == parse_config(_data())


@pytest.mark.parametrize(
    ("where", "key", "expected"),
    [
        (("applications", 0, "args"), "supported_model", "applications[0].args.supported_model"),
        (
            ("applications", 1, "args", "device_group"),
            "gpus_per_wroker",
            "applications[1].args.device_group.gpus_per_wroker",
        ),
        (
            ("applications", 1, "args", "queue_config"),
            "window_second",
            "applications[1].args.queue_config.window_second",
        ),
        ((), "task_queues", "task_queues"),
    ],
)
def test_misspellings_stay_refused(where, key, expected):
    data = _data()
    node = data
    for part in where:
        node = node[part]
    node[key] = 1
    assert _problems(data) == [f"{expected}: unknown field"]


def test_gpus_per_worker_contradicting_the_mesh_is_an_error():
    data = _data()
    data["applications"][2]["args"]["device_group"]["gpus_per_worker"] = 1  # tp_size is 2
    (problem,) = _problems(data)
    assert problem.startswith("applications[2].args.device_group.gpus_per_worker: 1 contradicts")
    assert "tp_size = 2" in problem
    data = _data()
    data["applications"][1]["args"]["device_group"]["gpus_per_worker"] = 2  # a model: 1 each
    (problem,) = _problems(data)
    assert problem.startswith("applications[1].args.device_group.gpus_per_worker: 2 contradicts")


def test_supported_models_in_both_places_must_agree():
    data = _data()
    data["applications"][0]["args"]["server_config"]["supported_models"] = ["other"]
    (problem,) = _problems(data)
    assert problem.startswith(
        "applications[0].args.supported_models: ['Qwen/Qwen3.5-4B'] contradicts"
    )
    data["applications"][0]["args"]["server_config"]["supported_models"] = ["Qwen/Qwen3.5-4B"]
    assert parse_config(data).applications[0].args.server_config.supported_models == [
        "Qwen/Qwen3.5-4B"
    ]


def test_queue_enabled_must_be_a_boolean():
    data = _data()
    data["applications"][1]["args"]["queue_config"]["enabled"] = "yes"
    (problem,) = _problems(data)
    assert problem == "applications[1].args.queue_config.enabled: must be true or false"


def test_check_config_accepts_the_mock_shape(tmp_path, capsys, monkeypatch):
    """Their mock config, as a user runs it: only an API key source is added (ours needs one)."""
    path = tmp_path / "server_config.yaml"
    path.write_text(
        textwrap.dedent(
            """
            proxy_location: EveryNode
            http_options: {host: 0.0.0.0, port: 8000}
            telemetry: {enabled: false, debug: false, service_name: twinkle-server}
            persistence: {mode: memory}
            applications:
              - name: server
                route_prefix: /api/v1
                import_path: server
                args:
                  server_config: {per_token_model_limit: 3}
                  supported_models: [mock-model]
              - name: models-mock
                route_prefix: /api/v1/model/mock
                import_path: model
                args:
                  backend: mock
                  model_id: mock-model
                  nproc_per_node: 1
                  device_group: {name: model, ranks: 1, device_type: cpu}
                  device_mesh: {device_type: cpu, dp_size: 1}
                  queue_config: {rps_limit: 100, tps_limit: 100000}
              - name: sampler-mock
                route_prefix: /api/v1/sampler/mock
                import_path: sampler
                args:
                  sampler_type: mock
                  model_id: mock-model
                  device_group: {name: sampler, ranks: 1, device_type: cpu}
                  device_mesh: {device_type: cpu, dp_size: 1}
            """
        )
    )
    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", "EMPTY_TOKEN")
    assert main(["check-config", "-c", str(path)]) == 0
    assert "OK: 3 applications (server, models-mock, sampler-mock)" in capsys.readouterr().out
