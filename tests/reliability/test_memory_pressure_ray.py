"""Real memory pressure under ``twinkle-server launch`` (Ray Serve): the node runs out of memory
because of one model replica, and the control plane lives.

The whole Ray head (GCS, raylet, Serve controller, gateway, state store, model replica) runs in a
memory cgroup whose limit leaves the model replica little room, and one tenant sends a batch
whose pass needs more than that room: the replica's budget does not know about the cgroup, so
the kernel's OOM killer has to act, as it would on a node that something else filled. Asserted:
the kernel killed the model replica and nothing else (Ray's GCS and raylet, the Serve controller,
the gateway and, with ``memory`` persistence, the state-store actor keep their processes), every
health check answered 200 throughout, the replica came back and served within a stated time, the
tenant whose adapter was lost gets the documented 410 and trains again on a new one, and a second
tenant resumes from its checkpoint (``file`` and ``memory`` persistence).

Needs root and a writable cgroup-v1 memory controller (skips saying so otherwise); slow tier.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from _fault_harness import NativeTenant, file_persistence, wait_until
from _fault_serve import ServeProcess

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
#: Memory the cgroup allows above what the started server holds: ample for ordinary steps of
#: the tiny model, far below the oversized batch's pass.
HEADROOM = 1 << 30
#: The oversized batch: 400 rows of 512 tokens, one pass of about 3.7 GB on the tiny model with
#: activation recompute off (the model's own budget, the node's share, lets it run as one pass).
BIG_ROWS, BIG_LENGTH = 400, 512
#: Process-title markers of what must outlive the replica: Ray's own daemons, the Serve
#: controller, the gateway, and (``memory`` persistence) the state-store actor.
CONTROL_PLANE = {
    "GCS": "gcs_server",
    "raylet": "raylet",
    "Serve controller": "ServeController",
    "gateway": "ServeReplica:server:TinkerCompatServer",
}
STATE_STORE = {"state store": "_StoreActor"}

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _own_memory_cgroup() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / path.lstrip("/")
    raise RuntimeError("no cgroup-v1 memory controller in /proc/self/cgroup")


@pytest.fixture
def memory_cgroup():
    """A fresh cgroup-v1 memory cgroup, removed after (its processes gone by then)."""
    if os.geteuid() != 0 or not (CGROUP_ROOT / "cgroup.procs").exists():
        pytest.skip("needs root and a cgroup-v1 memory controller at /sys/fs/cgroup/memory")
    path = CGROUP_ROOT / f"twinkle-oom-{os.getpid()}"
    try:
        path.mkdir()
    except OSError as error:
        pytest.skip(f"cannot create a memory cgroup: {error}")
    try:
        yield path
    finally:
        for _ in range(50):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def _processes(server: ServeProcess, marker: str) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []) and any(
                parent.pid == server.head_pid for parent in proc.parents()
            ):
                found.append(proc.info["pid"])
        except psutil.Error:
            continue
    return sorted(found)


class HealthPoller(threading.Thread):
    """``GET /api/v1/healthz`` every 0.2 s: every status code and the slowest answer."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.codes, self.slowest = url + "/api/v1/healthz", [], 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.codes.append(httpx.get(self.url, timeout=10).status_code)
            except httpx.HTTPError as error:
                self.codes.append(type(error).__name__)
            self.slowest = max(self.slowest, time.monotonic() - started)
            time.sleep(0.2)


@pytest.mark.parametrize("mode", ["file", "memory"])
def test_a_replica_that_runs_the_node_out_of_memory_is_the_one_killed(
    tmp_path, memory_cgroup, mode
):
    persistence = file_persistence(tmp_path) if mode == "file" else {"mode": "memory"}
    server = ServeProcess(tmp_path, persistence, max_loras=4)
    config = yaml.safe_load(server.config_path.read_text())
    config["applications"][1]["args"]["execution"] = {"activation_recompute": "off"}
    server.config_path.write_text(yaml.safe_dump(config))
    watched = {**CONTROL_PLANE, **(STATE_STORE if mode == "memory" else {})}
    poller = None
    home = _own_memory_cgroup()
    try:
        # Children inherit the cgroup at fork: start the head and the launch from inside it,
        # then step back out (this process's own later allocations stay outside).
        (memory_cgroup / "cgroup.procs").write_text(str(os.getpid()))
        try:
            server.start()
        finally:
            (home / "cgroup.procs").write_text(str(os.getpid()))

        victim, saver = NativeTenant(server, 0, 2, 1), NativeTenant(server, 1, 2, 1)
        for tenant in (victim, saver):
            tenant.open()
            tenant.train_step()
        checkpoint = saver.save("before-oom")
        model_pids = server.pids("model")
        control = {name: _processes(server, marker) for name, marker in watched.items()}
        assert len(model_pids) == 1 and all(len(p) == 1 for p in control.values()), control
        usage = int((memory_cgroup / "memory.usage_in_bytes").read_text())
        (memory_cgroup / "memory.limit_in_bytes").write_text(str(usage + HEADROOM))

        poller = HealthPoller(server.url)
        poller.start()
        sent = time.monotonic()
        with pytest.raises(Exception) as failed:  # the call whose replica the kernel killed
            victim.train_step(rows=BIG_ROWS, length=BIG_LENGTH)
        failed_after = time.monotonic() - sent
        oom_kills = int(
            dict(
                line.split()
                for line in (memory_cgroup / "memory.oom_control").read_text().splitlines()
            )["oom_kill"]
        )
        wait_until(
            lambda: server.pids("model") not in ([], model_pids) and server.model_healthy(),
            300,
            "model replica replaced",
            interval_s=0.2,
        )
        back_after = time.monotonic() - sent

        lost = victim.probe_lost()
        victim.adapter = "after-oom"
        victim._add()
        victim.train_step()
        saver.adapter = "resumed"
        saver._add()
        resumed_step = int(
            saver.model.resume_from_checkpoint(checkpoint, adapter_name="resumed")["cur_step"]
        )
        saver.train_step()
        poller.stopping.set()
        poller.join(timeout=15)

        print(
            f"[oom] ({mode}) killed by the kernel after {failed_after:.1f} s; model replica serving again"
            f" {back_after:.1f} s after the call; {len(poller.codes)} health checks, slowest"
            f" {poller.slowest:.2f} s; the call failed with: {str(failed.value)[:160]!r};"
            f" the lost adapter: {lost[:120]!r}"
        )
        assert oom_kills >= 1
        assert server.pids("model") != model_pids
        for name, marker in watched.items():
            assert _processes(server, marker) == control[name], f"the {name} was restarted"
        assert poller.codes and set(poller.codes) == {200}, poller.codes
        assert lost.startswith("410"), lost
        assert resumed_step == 1
    finally:
        if poller is not None:
            poller.stopping.set()
        server.stop()
