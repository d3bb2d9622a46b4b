"""Placement on a multi-node cluster with logical GPUs: the seed's 3-node layout and the e2e config.

Three local Ray nodes stand in for the seed's cluster (``ray start --head --num-gpus=4``, a worker
with 4 GPUs, a CPU-only worker). Ray hands each process that reserves GPUs its own
``CUDA_VISIBLE_DEVICES``; the compute falls back to the CPU (no CUDA here) while the placement is
real. API keys live only in the launcher's environment: replicas on the other nodes must accept them
anyway.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from seed_layouts import completed

from twinkle.server.config import parse_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
E2E = REPO / "cookbook" / "client" / "server" / "transformer" / "server_config_e2e.yaml"
# The `ray` command of this interpreter; `python -m ray.scripts.scripts` where no script was
# installed next to it (a venv that reuses the system's site-packages).
_RAY_SCRIPT = Path(sys.executable).with_name("ray")
RAY_COMMAND = (
    [str(_RAY_SCRIPT)] if _RAY_SCRIPT.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
)
KEY = "placement-test-key"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ray_start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                *RAY_COMMAND,
                "start",
                "--block",
                "--node-ip-address=127.0.0.1",
                "--disable-usage-stats",
                *args,
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head (4 GPUs), worker (4 GPUs), CPU worker; the ModelScope cache seeded on every node."""
    cache = tmp_path_factory.mktemp("modelscope")
    subprocess.run(
        [sys.executable, "-m", "twinkle.hub", "seed", "ms://Qwen/Qwen3.5-4B",
         "--from", "tiny://qwen3.5", "--cache-dir", str(cache)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    temp = Path(tempfile.mkdtemp(prefix="twp", dir="/tmp"))  # Ray's socket paths are bounded
    env = {
        k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TWINKLE_SERVER_API_KEYS")
    }
    env.update(
        RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", MODELSCOPE_CACHE=str(cache),
        MODELSCOPE_OFFLINE="1", HF_HUB_OFFLINE="1", RAY_SERVE_ENABLE_DIRECT_INGRESS="0",
    )  # fmt: skip
    port = _free_port()
    nodes = [
        _ray_start(["--head", f"--port={port}", "--num-gpus=4", "--num-cpus=8",
                    "--include-dashboard=false", f"--temp-dir={temp}"], env, temp / "head.log")
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not (temp / "ray_current_cluster").exists():
            assert nodes[0].poll() is None and time.monotonic() < deadline, (
                temp / "head.log"
            ).read_text()[-2000:]
            time.sleep(0.2)
        import ray

        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, namespace="placement-test")
        # One raylet at a time: two starting at once on 2 cores can time out their registration.
        for args, name in (
            (["--num-gpus=4", "--num-cpus=8"], "gpu"),
            (["--num-gpus=0", "--num-cpus=2"], "cpu"),
        ):
            nodes.append(
                _ray_start([f"--address=127.0.0.1:{port}", *args], env, temp / f"{name}.log")
            )
            deadline = time.monotonic() + 180
            while len([n for n in ray.nodes() if n["Alive"]]) < len(nodes):
                assert nodes[-1].poll() is None and time.monotonic() < deadline, (
                    f"the {name} node did not join: {(temp / f'{name}.log').read_text()[-1500:]}"
                )
                time.sleep(0.5)
        yield {"cache": cache}
    finally:
        import ray

        from twinkle.server.process.launch import shutdown

        shutdown() if ray.is_initialized() else None
        for process in reversed(nodes):
            _stop(process)
        shutil.rmtree(temp, ignore_errors=True)


def _launch(config_data: dict, monkeypatch) -> tuple[str, dict]:
    from ray import serve

    from twinkle.server.process import launch as launch_module

    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", KEY)  # the launcher's environment only
    config_data["http_options"] = {"host": "127.0.0.1", "port": _free_port()}
    config_data["proxy_location"] = "HeadOnly"
    config = parse_config(config_data)
    url = launch_module.launch(config, blocking=False, ready_timeout_s=600)
    placements = {
        app.name: serve.get_app_handle(app.name).placement.remote().result(timeout_s=120)
        for app in config.applications
        if app.import_path != "server"
    }
    return url, {"config": config, "placements": placements}


def _gpus(report: dict) -> set[tuple[str, str]]:
    """The (node, GPU id) pairs a process holds, checked against its CUDA_VISIBLE_DEVICES."""
    ids = report.get("gpu_ids") or []
    visible = report["cuda_visible_devices"]
    assert (visible or "") == ",".join(ids), report  # Ray set the variable to exactly its GPUs
    return {(report["node_id"], g) for g in ids}


def _teardown():
    from ray import serve

    serve.shutdown()


def test_the_seeds_three_node_layout(cluster, monkeypatch):
    """Model: 4 ranks, 1 GPU each, on one node; sampler: 2 ranks on the other GPU node."""
    import ray

    data = completed()
    for app in data["applications"]:
        if app["import_path"] == "sampler":
            app["args"]["sampler_type"] = "torch"  # vllm is not installed here
    try:
        url, launched = _launch(data, monkeypatch)
        model = launched["placements"]["models-Qwen3.5-4B"]
        sampler = launched["placements"]["sampler-Qwen3.5-4B"]
        assert model["replica"]["resources"].get("GPU", 0) == 0  # its ranks hold the GPUs
        assert len(model["workers"]) == 4 and len(sampler["workers"]) == 2
        model_nodes = {w["node_id"] for w in model["workers"]}
        sampler_nodes = {w["node_id"] for w in sampler["workers"]}
        assert len(model_nodes) == 1 and len(sampler_nodes) == 1  # nproc_per_node: packed
        assert model_nodes != sampler_nodes  # "components are placed on different nodes"
        model_gpus = set().union(*(_gpus(w) for w in model["workers"]))
        sampler_gpus = set().union(*(_gpus(w) for w in sampler["workers"]))
        assert len(model_gpus) == 4 and len(sampler_gpus) == 2
        assert all(w["resources"].get("GPU") == 1.0 for w in model["workers"] + sampler["workers"])
        assert {w["device"] for w in model["workers"]} == {"cpu"}  # no CUDA: CPU compute
        cpu_node = next(
            n["NodeID"] for n in ray.nodes() if n["Alive"] and not n["Resources"].get("GPU")
        )
        assert cpu_node not in model_nodes | sampler_nodes
        # Keys given only to the launcher reach every replica, on every node.
        origin = url.removesuffix("/api/v1")
        headers = {"Authorization": f"Bearer {KEY}"}
        model_status = f"{origin}/models/Qwen/Qwen3.5-4B/status"
        assert httpx.get(model_status, timeout=60).status_code == 401
        assert httpx.get(model_status, headers=headers, timeout=60).status_code == 200
        # The sampler (on the worker node) knows the key too: past auth, an unknown operation.
        op = f"{origin}/sampler/Qwen/Qwen3.5-4B/no_such_operation"
        assert httpx.post(op, json={}, timeout=60).status_code == 401
        answer = httpx.post(op, json={}, headers=headers, timeout=60)
        assert answer.status_code in (400, 404) and "operation" in answer.text, answer.text
        routes = httpx.get(f"{url}/routes", headers=headers, timeout=60)
        assert routes.status_code == 200, routes.text
    finally:
        _teardown()


def test_the_e2e_config_gives_training_and_sampling_their_own_gpu(cluster, monkeypatch):
    """server_config_e2e.yaml: GPU 0 for training, another GPU for sampling (mock compute)."""
    data = yaml.safe_load(E2E.read_text())
    for app in data["applications"]:
        if app["import_path"] == "model":
            app["args"]["backend"] = "mock"
        if app["import_path"] == "sampler":
            app["args"]["sampler_type"] = "mock"
    data["persistence"] = {"mode": "memory"}
    data["storage"] = {"root": str(cluster["cache"].parent / "e2e-storage")}
    try:
        _, launched = _launch(data, monkeypatch)
        model = launched["placements"]["models-Qwen3.5-4B"]["replica"]
        sampler = launched["placements"]["sampler-Qwen3.5-4B"]["replica"]
        assert model["resources"]["GPU"] == sampler["resources"]["GPU"] == 1.0
        model_gpu, sampler_gpu = _gpus(model), _gpus(sampler)
        assert len(model_gpu) == len(sampler_gpu) == 1 and model_gpu != sampler_gpu
        processor = launched["placements"]["processor"]["replica"]
        assert not processor["resources"].get("GPU")
    finally:
        _teardown()
