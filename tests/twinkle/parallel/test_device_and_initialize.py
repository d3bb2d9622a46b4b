"""DeviceGroup / DeviceMesh validation, ``initialize`` modes, and the server's use of dp_size."""

import subprocess
import sys

import pytest

import twinkle
from tests.twinkle_server.config.config_samples import full_config_data, tiny_config_data
from twinkle.parallel import DeviceGroup, DeviceMesh, DeviceMeshError, initialize


@pytest.fixture(autouse=True)
def _no_context_left_behind(monkeypatch):
    monkeypatch.setattr(sys.modules["twinkle.parallel.initialize"], "_current", None)


def test_mesh_must_fit_an_accelerator_group():
    group = DeviceGroup(name="model", ranks=4, device_type="CUDA")
    assert group.device_type == "cuda"
    DeviceMesh(device_type="cuda", dp_size=2, tp_size=2).check_fits(group)
    with pytest.raises(
        DeviceMeshError, match="2\\*2\\*2 = 8 exceeds DeviceGroup 'model' ranks = 4"
    ):
        DeviceMesh(device_type="cuda", dp_size=2, tp_size=2, pp_size=2).check_fits(group)
    with pytest.raises(DeviceMeshError, match="differs"):
        DeviceMesh(device_type="cpu").check_fits(group)


def test_cpu_groups_count_processes_not_devices():
    utility = DeviceGroup(name="utility", ranks=0, device_type="cpu")
    DeviceMesh(device_type="CPU", dp_size=4).check_fits(utility)
    assert utility.bundles(processes=4) == [{"CPU": 1.0}] * 4
    assert DeviceGroup("model", ranks=2, num_cpus=0.5).bundles() == [{"GPU": 1.0, "CPU": 0.5}] * 2
    labelled = DeviceGroup(
        "p", ranks=1, device_type="cpu", num_cpus=0.5, resources={"processor_node": 1}
    )
    assert labelled.bundles() == [{"CPU": 0.5, "processor_node": 1.0}]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dp_size": 0}, "dp_size must be an integer >= 1"),
        ({"dp_size": 3, "ep_size": 2}, "ep_size 2 must divide"),
        ({"device_type": "tpu"}, "device_type must be one of"),
    ],
)
def test_inconsistent_meshes_are_rejected(kwargs, message):
    with pytest.raises(DeviceMeshError, match=message):
        DeviceMesh(**kwargs)


def test_check_config_rejects_meshes_that_do_not_fit():
    from twinkle.server.config import ConfigError, parse_config

    data = full_config_data()
    data["applications"][1]["args"]["device_mesh"]["dp_size"] = 4  # ranks: 2
    with pytest.raises(ConfigError, match="exceeds device_group.ranks = 2"):
        parse_config(data)
    data = full_config_data()
    data["applications"][1]["args"]["device_mesh"].update(
        dp_size=1, ep_size=2
    )  # megatron, dp*tp = 1
    with pytest.raises(ConfigError, match="ep_size: 2 must divide dp_size\\*tp_size = 1"):
        parse_config(data)
    data = full_config_data()
    data["applications"][1]["args"].update(backend="transformers")
    data["applications"][1]["args"]["device_mesh"].update(dp_size=1, tp_size=2)
    with pytest.raises(ConfigError, match="tp_size: 2 > 1 needs backend 'megatron'"):
        parse_config(data)


def test_the_mock_has_no_data_parallel_replicas():
    from twinkle.server.model.backend import create_backend

    with pytest.raises(ValueError, match="dp_size 2 > 1 needs backend 'transformers'"):
        create_backend("mock", "tiny://qwen3", dp_size=2)


def test_megatron_data_parallel_builds_ray_replicas():
    """dp_size 2 on megatron is the data-parallel model of megatron replicas (tp 1 each)."""
    from twinkle.server.model.backend import create_backend

    with pytest.raises(RuntimeError, match="DataParallelModel needs Ray"):
        create_backend("megatron", "tiny://qwen3", dp_size=2)


def test_build_service_passes_the_mesh_to_the_backend(monkeypatch):
    from twinkle.model.options import ExecutionOptions
    from twinkle.server.config import parse_config
    from twinkle.server.model import deployment
    from twinkle.server.process.placement import memory_budget_mb

    data = tiny_config_data()
    model_app = next(a for a in data["applications"] if a["import_path"] == "model")
    model_app["args"].update(
        backend="transformers",
        device_group={"name": "model", "ranks": 0, "device_type": "cpu"},
        device_mesh={"device_type": "cpu", "dp_size": 2},
    )
    model_app["deployments"][0]["ray_actor_options"] = {
        "num_cpus": 0.25,
        "resources": {"trainer": 1},
    }
    config = parse_config(data)
    seen = {}

    def fake_backend(backend, model_id, **kwargs):
        seen.update(kwargs, backend=backend)
        raise RuntimeError("stop here")

    monkeypatch.setattr(deployment, "create_backend", fake_backend)
    with pytest.raises(RuntimeError, match="stop here"):
        deployment.build_service(
            next(a for a in config.applications if a.import_path == "model"), None
        )
    assert seen == {
        "backend": "transformers",
        "dp_size": 2,
        "device_type": "cpu",
        "worker_options": {"num_cpus": 0.25, "resources": {"trainer": 1.0}},
        # The model's execution options (the config's execution: block, here all defaults),
        # with each rank's half of the replica's memory budget (a share of this CPU node).
        "options": ExecutionOptions.from_env(
            memory_budget_mb=memory_budget_mb(
                next(a for a in config.applications if a.import_path == "model"), None
            )
            // 2
        ),
    }


def test_local_mode_records_the_groups():
    groups = [DeviceGroup("model", ranks=4), DeviceGroup("utility", ranks=0, device_type="cpu")]
    with initialize(mode="local", groups=groups) as context:
        assert twinkle.parallel.current_context() is context
        assert context.group("model").ranks == 4
    assert twinkle.parallel.current_context() is None
    with pytest.raises(ValueError, match="duplicate device group"):
        initialize(groups=[DeviceGroup("a"), DeviceGroup("a")])
    with pytest.raises(ValueError, match="unknown mode"):
        initialize(mode="grpc")


def test_http_mode_needs_a_config_and_the_server(monkeypatch):
    monkeypatch.delenv("TWINKLE_SERVER_CONFIG", raising=False)
    with pytest.raises(ValueError, match="needs the server config or device groups"):
        initialize(mode="http")
    # twinkle-server not installed: neither the package nor any of its modules imports.
    for name in [
        m for m in sys.modules if m == "twinkle.server" or m.startswith("twinkle.server.")
    ]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "twinkle.server", None)
    with pytest.raises(ImportError, match="pip install twinkle-server"):
        initialize(mode="http", config=tiny_config_data())


def test_http_mode_launches_the_config_and_checks_the_groups(monkeypatch):
    from twinkle.server.process import launch

    launched = {}

    def fake_launch(config, namespace=None, blocking=True):
        launched.update(config=config, namespace=namespace, blocking=blocking)
        return "http://127.0.0.1:8000/api/v1"

    monkeypatch.setattr(launch, "launch", fake_launch)
    data = full_config_data()  # model: 2 cuda ranks in group 'model'
    context = initialize(
        mode="http",
        groups=[DeviceGroup("model", ranks=4)],
        config=data,
        namespace="ns",
        blocking=False,
    )
    assert context.server_url == "http://127.0.0.1:8000/api/v1"
    assert (launched["namespace"], launched["blocking"]) == ("ns", False)
    assert launched["config"].applications[1].args.device_mesh.dp_size == 2
    with pytest.raises(
        DeviceMeshError, match="asks device group 'model' for 2 cuda devices; the group has 1"
    ):
        initialize(mode="http", groups=[DeviceGroup("model", ranks=1)], config=data, blocking=False)


def test_http_mode_with_groups_alone_builds_the_seeds_deployment(monkeypatch):
    """The seed's server.py: three groups, nothing else."""
    from twinkle.server.process import launch

    monkeypatch.delenv("TWINKLE_SERVER_CONFIG", raising=False)
    monkeypatch.delenv("TWINKLE_BASE_MODEL", raising=False)
    launched = {}
    monkeypatch.setattr(
        launch, "launch", lambda config, namespace=None, blocking=True: launched.update(c=config)
    )
    device_groups = [
        DeviceGroup(name="model", ranks=4, device_type="cuda"),
        DeviceGroup(name="sampler", ranks=4, device_type="cuda"),
        DeviceGroup(name="utility", ranks=0, device_type="cpu"),
    ]
    twinkle.initialize(mode="http", groups=device_groups, blocking=False)
    config = launched["c"]
    model, sampler = config.applications_of("model")[0], config.applications_of("sampler")[0]
    assert model.args.model_id == sampler.args.model_id == "ms://Qwen/Qwen3.5-4B"
    assert model.route_prefix == "/api/v1/model/Qwen/Qwen3.5-4B"
    assert (model.args.device_group.ranks, model.args.device_mesh.dp_size) == (4, 4)
    assert model.args.nproc_per_node == 4 and sampler.args.device_mesh.dp_size == 4
    assert sampler.args.sampler_type in ("vllm", "torch")
    assert config.applications_of("processor")[0].args.device_group.device_type == "cpu"
    assert config.server_application.args.server_config.supported_models == ["Qwen/Qwen3.5-4B"]
    from twinkle.server.process.placement import replica_num_gpus, worker_options

    # Data parallel: the replica holds no GPU, each of the 4 ranks one, all 4 on one node.
    assert replica_num_gpus(model) == 0
    assert worker_options(model) == {"num_gpus": 1.0, "nproc_per_node": 4}
    # The base model comes from the environment when set.
    monkeypatch.setenv("TWINKLE_BASE_MODEL", "tiny://qwen3.5")
    twinkle.initialize(mode="http", groups=device_groups[:1], blocking=False)
    assert [a.args.model_id for a in launched["c"].applications_of("model")] == ["tiny://qwen3.5"]
    with pytest.raises(Exception, match="need a DeviceGroup named 'model'"):
        twinkle.initialize(mode="http", groups=device_groups[1:], blocking=False)


def test_import_twinkle_stays_light():
    code = (
        "import sys, twinkle\n"
        "from twinkle import DeviceGroup, DeviceMesh, initialize\n"
        "assert DeviceGroup.__module__ == 'twinkle.parallel.device' and callable(initialize)\n"
        "assert not {'torch', 'ray'} & set(sys.modules), sorted({'torch', 'ray'} & set(sys.modules))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
