"""Fault injection under a real ``twinkle-server launch`` (Ray Serve), for
``test_faults_replica.py`` (issue 28 point 3, one replica killed): the same config, tenants and
checks as ``_fault_harness`` (whose ``ServerProcess`` runs ``--local``), on a Ray head of its
own, so that ONE Serve replica (gateway or model) or one data-parallel worker actor can be
SIGKILLed while the rest of the server lives on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml
from _fault_harness import MODEL_ROUTE, ServerProcess, wait_until

REPLICA_MARKERS = {
    "server": "ServeReplica:server:TinkerCompatServer",
    "model": "ServeReplica:model:ModelManagement",
    "dp_worker": "ReplicaWorker",
}


class ServeProcess(ServerProcess):
    """``twinkle-server launch -c`` (Ray Serve, direct ingress on) with ``RAY_ADDRESS`` set to a
    ``ray start --head`` that this object starts and stops by its pid (never ``ray stop``).

    ``dp_size`` > 1 gives the model application a CPU ``device_mesh`` of that many
    ``DataParallelModel`` worker actors.
    """

    def __init__(self, tmp_path: Path, persistence: dict, max_loras: int = 8, dp_size: int = 1):
        super().__init__(tmp_path, persistence, max_loras)
        if dp_size > 1:
            config = yaml.safe_load(self.config_path.read_text())
            config["applications"][1]["args"].update(
                device_group={"name": "model", "ranks": dp_size, "device_type": "CPU"},
                device_mesh={"device_type": "cpu", "dp_size": dp_size},
            )
            self.config_path.write_text(yaml.safe_dump(config))
        self._head = None  # the ray_head context manager while it runs
        self.head_pid: int | None = None
        self.address: str | None = None

    def _start_head(self) -> None:
        import contextlib

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle_client"))
        from cookbook_launch import ray_head

        from twinkle.server.process.launch import LOCAL_RAY_ENV

        # Ray workers inherit the raylet's environment: the offline and direct-ingress settings
        # that ``launch`` gives a Ray it starts itself go to ``ray start``.
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(LOCAL_RAY_ENV, TWINKLE_OUTPUT_DIR=str(self.tmp_path / "out"))
        self._head = contextlib.ExitStack()
        self.address = self._head.enter_context(ray_head(env, num_gpus=0, num_cpus=8))
        self.head_pid = _listener_ancestor(self.address)

    def start(self, timeout_s: float = 300.0) -> None:
        if self._head is None:
            self._start_head()
        spawned = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "twinkle.server", "launch", "-c", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "RAY_ADDRESS": self.address},
            )

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"launch exited: {self.log.read_text()[-3000:]}")
            return "Twinkle server ready at" in self.log.read_text(errors="replace")

        wait_until(up, timeout_s, "twinkle-server launch ready", interval_s=0.5)
        wait_until(self.healthy, 60, "gateway healthy", interval_s=0.2)
        self.starts.append(time.monotonic() - spawned)

    def model_healthy(self) -> bool:
        try:
            return httpx.get(self.url + MODEL_ROUTE + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def pids(self, what: str) -> list[int]:
        """Pids of this server's processes of ``what`` (a key of ``REPLICA_MARKERS``): Ray
        workers under this object's head whose process title names the actor."""
        import psutil

        marker, found = REPLICA_MARKERS[what], []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if marker in " ".join(proc.info["cmdline"] or []) and any(
                    parent.pid == self.head_pid for parent in proc.parents()
                ):
                    found.append(proc.info["pid"])
            except psutil.Error:
                continue
        return sorted(found)

    def sigkill(self, what: str, index: int = 0) -> int:
        """SIGKILL one process of ``what``; returns its pid."""
        pids = self.pids(what)
        if not pids:
            raise AssertionError(f"no {what} process under the Ray head {self.head_pid}")
        os.kill(pids[index], signal.SIGKILL)
        return pids[index]

    def wait_replaced(self, what: str, old_pid: int, timeout_s: float = 240.0) -> None:
        """Until Serve has replaced the killed replica and the application answers again."""
        healthy = self.healthy if what == "server" else self.model_healthy
        wait_until(
            lambda: any(p != old_pid for p in self.pids(what)) and healthy(),
            timeout_s,
            f"{what} replica replaced",
            interval_s=0.2,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # launch shuts Serve down
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._head is not None:
            self._head.close()
            self._head = None


def _listener_ancestor(address: str) -> int:
    """The pid of the ``ray start`` process whose GCS listens on ``address`` (host:port)."""
    import psutil

    port = int(address.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            gcs = psutil.Process(conn.pid)
            return gcs.parent().pid
    raise AssertionError(f"nothing listens on {address}")
