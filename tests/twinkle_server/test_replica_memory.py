"""A model replica's memory budget (``execution.memory_budget_mb``) and the Ray settings that keep
the control plane alive when a node runs low on memory; a torch sampler replica's budget too."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from twinkle.server.config import parse_config  # noqa: E402
from twinkle.server.process.launch import LOCAL_RAY_ENV  # noqa: E402
from twinkle.server.process.placement import (  # noqa: E402
    CONTROL_PLANE_RESERVE_MB,
    MODEL_SHARE,
    _node_memory_mb,
    memory_budget_mb,
)
from twinkle.server.testing import config_dict, local_server  # noqa: E402


def _model_app(data):
    config = parse_config(data)
    return next(a for a in config.applications if a.import_path == "model"), config


def _cpu_share(replicas):
    return int((_node_memory_mb() - CONTROL_PLANE_RESERVE_MB) * MODEL_SHARE / replicas)


def test_the_config_value_wins():
    data = config_dict()
    data["applications"][1]["args"]["execution"] = {"memory_budget_mb": 1234}
    data["applications"][1]["deployments"] = [
        {"name": "M", "ray_actor_options": {"memory": 8 << 30}}
    ]
    assert memory_budget_mb(*_model_app(data)) == 1234


def test_the_ray_memory_resource_is_the_default():
    data = config_dict()
    data["applications"][1]["deployments"] = [
        {"name": "M", "ray_actor_options": {"memory": 6 << 30}}
    ]
    assert memory_budget_mb(*_model_app(data)) == 6 << 10


def test_on_a_cpu_node_the_model_replicas_share_the_node():
    data = config_dict()
    assert memory_budget_mb(*_model_app(data)) == _cpu_share(1)
    data["applications"][1]["deployments"] = [{"name": "M", "num_replicas": 2}]
    assert memory_budget_mb(*_model_app(data)) == _cpu_share(2)
    assert 0 < _cpu_share(2) < _node_memory_mb() // 2


def test_an_accelerator_replica_is_bounded_by_its_device():
    data = config_dict()
    data["applications"][1]["args"]["device_group"] = {
        "name": "model", "ranks": 1, "device_type": "cuda"
    }  # fmt: skip
    assert memory_budget_mb(*_model_app(data)) is None


def test_the_replica_builds_its_model_with_the_budget(tmp_path):
    server = local_server(tmp_path, execution={"memory_budget_mb": 2500})
    assert server.services["model"].model.options.memory_budget_mb == 2500
    default = local_server(tmp_path / "default")
    assert default.services["model"].model.options.memory_budget_mb == _cpu_share(1)


@pytest.mark.parametrize("bad", [0, -1, "a lot"])
def test_a_bad_budget_is_a_config_error(bad):
    data = config_dict()
    data["applications"][1]["args"]["execution"] = {"memory_budget_mb": bad}
    with pytest.raises(Exception, match="memory_budget_mb"):
        parse_config(data)


def test_a_ray_that_launch_starts_leaves_memory_kills_to_the_kernel():
    # Ray's monitor would kill the restartable control-plane actors first (see launch.py).
    assert LOCAL_RAY_ENV["RAY_memory_monitor_refresh_ms"] == "0"


def test_a_torch_sampler_replica_shares_the_node_and_takes_its_own_budget(tmp_path):
    data = config_dict(sampler=True)
    config = parse_config(data)
    model, sampler = (
        next(a for a in config.applications if a.import_path == kind)
        for kind in ("model", "sampler")
    )
    # The model and the torch sampler both hold a model in their own memory: two shares.
    assert memory_budget_mb(model, config) == _cpu_share(2)
    assert memory_budget_mb(sampler, config) == _cpu_share(2)
    data["applications"][2]["args"]["execution"] = {"memory_budget_mb": 1500}
    assert (
        memory_budget_mb(
            next(a for a in parse_config(data).applications if a.import_path == "sampler"), None
        )
        == 1500
    )
    # A mock sampler holds no model: no budget, and no share taken from the model.
    data["applications"][2]["args"] = {"model_id": "tiny://qwen3", "sampler_type": "mock"}
    config = parse_config(data)
    mock = next(a for a in config.applications if a.import_path == "sampler")
    assert memory_budget_mb(mock, config) is None
    assert memory_budget_mb(
        next(a for a in config.applications if a.import_path == "model"), config
    ) == _cpu_share(1)
    server = local_server(tmp_path, sampler=True)
    assert server.services["sampler"].sampler.options.memory_budget_mb == _cpu_share(2)


def test_data_parallel_ranks_share_the_replicas_budget():
    from twinkle.server.process.placement import model_processes, process_memory_budget_mb

    data = config_dict()
    args = data["applications"][1]["args"]
    args["device_group"] = {"name": "model", "ranks": 2, "device_type": "cpu"}
    args["device_mesh"] = {"device_type": "cpu", "dp_size": 2}
    model, config = _model_app(data)
    assert model_processes(model) == 2
    # The replica's budget is unchanged; each rank's process takes half of it.
    assert memory_budget_mb(model, config) == _cpu_share(1)
    assert process_memory_budget_mb(model, config) == _cpu_share(1) // 2
    args["execution"] = {"memory_budget_mb": 3001}
    model, config = _model_app(data)
    assert process_memory_budget_mb(model, config) == 1500
    # One process (no data parallel): the whole budget.
    args.pop("device_mesh")
    args.pop("device_group")
    model, config = _model_app(data)
    assert model_processes(model) == 1
    assert process_memory_budget_mb(model, config) == 3001
