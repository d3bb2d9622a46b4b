"""Two Ray "nodes" on one machine: a device group with a node label lands on the labelled node."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import twinkle
from twinkle.parallel import DeviceGroup

pytestmark = pytest.mark.integration

# The `ray` command of this interpreter; `python -m ray.scripts.scripts` where no script was
# installed next to it (a venv that reuses the system's site-packages).
_RAY_SCRIPT = Path(sys.executable).with_name("ray")
RAY_COMMAND = (
    [str(_RAY_SCRIPT)] if _RAY_SCRIPT.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ray_start(*args: str, log: Path) -> subprocess.Popen:
    """``ray start --block``: the node lives as long as this process, which we stop by its pid
    (``ray stop`` would stop every Ray on the machine, other engineers' included)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*RAY_COMMAND, "start", "--block", "--node-ip-address=127.0.0.1", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # --block: the node stops its own raylet and workers
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_for(path: Path, process: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the Ray head did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)


@pytest.fixture
def two_nodes():
    temp = Path(tempfile.mkdtemp(prefix="twr", dir="/tmp"))  # short: Ray's socket paths are bounded
    port = _free_port()
    head = _ray_start(
        "--head",
        f"--port={port}",
        "--num-cpus=1",
        "--include-dashboard=false",
        f"--temp-dir={temp}",
        "--disable-usage-stats",
        log=temp / "head.log",
    )
    nodes = [head]
    try:
        _wait_for(temp / "ray_current_cluster", head, temp / "head.log")
        nodes.append(
            _ray_start(
                f"--address=127.0.0.1:{port}",
                "--num-cpus=1",
                '--resources={"processor_node": 1}',
                log=temp / "worker.log",
            )
        )
        yield f"127.0.0.1:{port}"
    finally:
        for process in reversed(nodes):
            _stop(process)
        shutil.rmtree(temp, ignore_errors=True)


def test_a_labelled_group_runs_on_the_labelled_node(two_nodes):
    import ray

    from twinkle.parallel import DataParallelSampler

    group = DeviceGroup(
        "processor", ranks=1, device_type="cpu", num_cpus=0.5, resources={"processor_node": 1}
    )
    # The placement group waits for the second node to join: no polling needed.
    with twinkle.initialize(
        mode="ray", address=two_nodes, groups=[group], placement_timeout_s=90
    ) as context:
        labelled = [
            n["NodeID"] for n in ray.nodes() if n["Alive"] and "processor_node" in n["Resources"]
        ]
        head = ray.get_runtime_context().get_node_id()

        class WhereAmI:
            def sample(self):
                import ray

                return ray.get_runtime_context().get_node_id()

        sampler = DataParallelSampler(
            WhereAmI,
            dp_size=1,
            num_cpus=0.5,
            resources={"processor_node": 1},
            placement_group=context.placement_group("processor"),
        )
        try:
            node = sampler.sample()
        finally:
            sampler.shutdown()
        assert len(labelled) == 1 and labelled[0] != head
        assert node == labelled[0]
    assert not ray.is_initialized()
