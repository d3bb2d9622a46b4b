"""Fault injection for the reliability tests: a server in its own process that a test SIGKILLs
and relaunches, and tenants that train through it with the real clients (``twinkle_client`` and
the ``tinker`` SDK) and recover the way a careful user script does.

A tenant's recovery is the documented one: an in-flight call ends with an error (never a hang),
the tenant waits for the server, learns that its adapter was lost (HTTP 410 / a failed future
saying so), and resumes from its newest checkpoint, counting steps from the checkpoint's
``cur_step``; so its final step count is exactly the target, whatever the kill interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

BASE = "tiny/qwen3"
MODEL_ROUTE = f"/api/v1/model/{BASE}"
KEYS = [f"fault-key-{i:02d}-secret" for i in range(8)]
BIG_BATCH = (32, 192)  # rows, tokens: a step long enough (about 1 s) to be killed mid-way
FUTURE_TIMEOUT_S = 150.0
PROBE = [{"input_ids": list(range(40, 56)), "labels": list(range(40, 56))}]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll ``condition`` until true; :class:`TimeoutError` naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(interval_s)


def file_persistence(tmp_path: Path) -> dict:
    return {"mode": "file", "file_path": str(tmp_path / "state.json")}


def redis_persistence(url: str, prefix: str) -> dict:
    return {"mode": "redis", "redis_url": url, "key_prefix": prefix}


class ServerProcess:
    """``twinkle-server launch --local`` in a child process, on a fixed port across relaunches."""

    def __init__(
        self, tmp_path: Path, persistence: dict, max_loras: int = 8, sampler: bool = False
    ) -> None:
        self.tmp_path, self.port = tmp_path, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.storage = tmp_path / "storage"
        config = {
            "http_options": {"host": "127.0.0.1", "port": self.port},
            "persistence": persistence,
            "storage": {"root": str(self.storage)},
            "auth": {"api_keys": KEYS},
            "applications": [
                {
                    "name": "server",
                    "route_prefix": "/api/v1",
                    "import_path": "server",
                    "args": {
                        "server_config": {"supported_models": [BASE], "per_token_model_limit": 8}
                    },
                },
                {
                    "name": "model",
                    "route_prefix": MODEL_ROUTE,
                    "import_path": "model",
                    "args": {
                        "backend": "transformers",
                        "model_id": "tiny://qwen3",
                        "max_loras": max_loras * 2,
                    },
                },
            ],
        }
        if sampler:  # the torch sampler of the same model (the Tinker sampling clients')
            config["applications"].append(
                {
                    "name": "sampler",
                    "route_prefix": f"/api/v1/sampler/{BASE}",
                    "import_path": "sampler",
                    "args": {"model_id": "tiny://qwen3", "sampler_type": "torch"},
                }
            )
        self.config_path = tmp_path / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen | None = None
        self.log = tmp_path / "server.log"
        self.starts: list[float] = []  # seconds from spawn to the first healthy answer
        self.restarted = threading.Event()

    def store(self):
        """A client of the server's own state store (the same config, so the same key prefix)."""
        from twinkle.server.config import parse_config
        from twinkle.server.state import create_store

        return create_store(parse_config(yaml.safe_load(self.config_path.read_text())).persistence)

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/api/v1/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, timeout_s: float = 90.0) -> None:
        spawned = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "twinkle.server", "launch", "-c", str(self.config_path)]
                + ["--local"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TWINKLE_OUTPUT_DIR": str(self.tmp_path / "out")},
            )

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-3000:]}")
            return self.healthy()

        wait_until(up, timeout_s, "server healthy", interval_s=0.1)
        self.starts.append(time.monotonic() - spawned)

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no flush; exactly what a crash or the OOM killer does."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()

    def checkpoint_state(self, key: str, path: str) -> dict:
        """``trainer_state.json`` of the checkpoint at ``twinkle://`` / ``tinker://`` ``path``."""
        from twinkle.server.state import checkpoint_dir, parse_checkpoint_path, tenant_id_for_key

        run_id, kind, name = parse_checkpoint_path(path)
        directory = checkpoint_dir(self.storage, tenant_id_for_key(key), run_id, kind, name)
        return json.loads((directory / "trainer_state.json").read_text())


def batch(seed: int, rows: int = 2, length: int = 12) -> list[dict]:
    ids = np.random.default_rng(seed).integers(10, 4000, size=(rows, length)).tolist()
    return [{"input_ids": r, "labels": r} for r in ids]


@dataclass
class TenantReport:
    """What one tenant saw: progress, the errors of the fault, and the figures checked after."""

    name: str
    key: str
    target: int
    steps: int = 0
    checkpoints: list[str] = field(default_factory=list)  # every checkpoint path, in order
    probe_at: dict[str, float] = field(default_factory=dict)  # checkpoint -> loss right after
    probe_resumed: dict[str, float] = field(default_factory=dict)  # ... and once resumed
    fault_errors: list[str] = field(default_factory=list)
    lost_errors: list[str] = field(default_factory=list)
    resumed_from: list[tuple[str, int]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    final_path: str | None = None
    recovery_s: list[float] = field(default_factory=list)  # kill -> first step after
    failure: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Tenant:
    """Trains ``target`` steps, a checkpoint every ``every`` steps, surviving server faults.

    ``server_down`` is set by the test while the server is dead; the tenant waits for it to be
    cleared (and the server healthy) before it recovers.
    """

    kind = "tenant"

    def __init__(self, server: ServerProcess, index: int, target: int, every: int) -> None:
        self.server, self.index = server, index
        self.report = TenantReport(f"{self.kind}-{index}", KEYS[index], target)
        self.every = every
        self.hold_at = every + 1  # a checkpoint exists, and the step after it is interrupted
        self.killed_at: float | None = None
        self.in_flight = threading.Event()  # set when the interrupted step has been sent
        self.in_flight_batch = BIG_BATCH
        self.all_held: threading.Barrier | None = None  # see hold_together
        self.killed = threading.Event()

    def hold(self) -> None:
        if self.all_held is not None:
            self.all_held.wait(timeout=300)

    def run(self) -> None:
        report = self.report
        try:
            self.open()
            while report.steps < report.target:
                try:
                    if report.steps == self.hold_at and self.killed_at is None:
                        self.in_flight_step()  # the step the kill interrupts
                        # Finished before the kill: wait for it, the next call meets it.
                        wait_until(self.killed.is_set, 300, f"{report.name}: the kill")
                    else:
                        self.train_step()
                    report.steps += 1
                    if len(report.recovery_s) < len(report.resumed_from):
                        report.recovery_s.append(time.monotonic() - self.killed_at)
                    if report.steps % self.every == 0 or report.steps == report.target:
                        self.checkpoint(f"step-{report.steps}")
                except Exception as exc:  # noqa: BLE001 - the fault under test
                    if self.killed_at is None or not self.is_fault(exc):
                        raise
                    report.fault_errors.append(f"{type(exc).__name__}: {exc}")
                    self.recover()
            report.final_path = report.checkpoints[-1]
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            report.failure = exc
            if self.all_held is not None:
                self.all_held.abort()  # the others must not wait for it at the barrier
        finally:
            report.done.set()

    def recover(self) -> None:
        wait_until(
            lambda: self.server.restarted.is_set() and self.server.healthy(),
            180,
            f"{self.report.name}: server back",
        )
        lost = self.probe_lost()
        self.report.lost_errors.append(lost)
        latest = self.report.checkpoints[-1]
        self.report.steps = self.resume(latest)
        self.report.resumed_from.append((latest, self.report.steps))
        self.report.probe_resumed[latest] = self.probe_loss()

    def checkpoint(self, name: str) -> None:
        path = self.save(name)
        self.report.checkpoints.append(path)
        self.report.probe_at[path] = self.probe_loss()

    # Subclasses: open, train_step, save, probe_loss, probe_lost, resume, is_fault.


class NativeTenant(Tenant):
    """A ``twinkle_client`` user: ``MultiLoraTransformersModel`` over ``TwinkleClient``."""

    kind = "native"

    def open(self) -> None:
        from twinkle_client import TwinkleClient
        from twinkle_client.model import MultiLoraTransformersModel

        self.client = TwinkleClient(
            base_url=self.server.url, api_key=self.report.key, timeout=120, max_retries=0
        )
        self.model = MultiLoraTransformersModel(model_id="tiny://qwen3", client=self.client)
        self.adapter = "default"
        self._add()

    def _add(self) -> None:
        self.model.add_adapter_to_model(self.adapter, {"r": 4, "lora_alpha": 8})
        self.model.set_optimizer("Adam", lr=1e-2, adapter_name=self.adapter)
        self.report.run_ids.append(self.model.training_run_id or self._run_id())

    def _run_id(self) -> str:
        return self.model.get_train_configs(adapter_name=self.adapter).training_run_id

    def train_step(self, rows: int = 2, length: int = 12) -> None:
        inputs = batch(self.index * 1000 + self.report.steps, rows, length)
        self.model.forward_backward(inputs=inputs, adapter_name=self.adapter)
        self.model.clip_grad_and_step(adapter_name=self.adapter)

    def in_flight_step(self) -> None:
        self.hold()
        self.in_flight.set()
        self.train_step(*self.in_flight_batch)

    def save(self, name: str) -> str:
        return self.model.save(name, save_optimizer=True, adapter_name=self.adapter)

    def probe_loss(self) -> float:
        out = self.model.forward_only(inputs=PROBE, adapter_name=self.adapter)
        return float(out["loss"])

    def probe_lost(self) -> str:
        from twinkle_client.errors import TwinkleServerError

        try:
            self.model.forward_only(inputs=PROBE, adapter_name=self.adapter)
        except TwinkleServerError as exc:
            return f"{exc.status}: {exc}"
        return "no error: the adapter survived"

    def resume(self, path: str) -> int:
        self.adapter = f"default-r{len(self.report.resumed_from) + 1}"
        self._add()
        return int(self.model.resume_from_checkpoint(path, adapter_name=self.adapter)["cur_step"])

    def is_fault(self, exc: BaseException) -> bool:
        from twinkle_client.errors import ServerUnavailableError

        return isinstance(exc, (ServerUnavailableError, httpx.TransportError)) or (
            self.killed_at is not None and "lost" in str(exc)
        )


class TinkerTenant(Tenant):
    """An unmodified ``tinker`` SDK user (``ServiceClient`` / ``TrainingClient``)."""

    kind = "tinker"

    def open(self) -> None:
        import tinker

        from twinkle_client import init_tinker_client

        init_tinker_client()
        self.service = tinker.ServiceClient(base_url=self.server.url, api_key=self.report.key)
        self.training = self.service.create_lora_training_client(base_model=BASE, rank=4).result(
            timeout=120
        )
        self.report.run_ids.append(self.training.model_id)

    def _datums(self, seed: int, rows: int = 2, length: int = 12):
        from tinker import types

        out = []
        for row in batch(seed, rows, length):
            tokens = row["input_ids"]
            out.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={
                        "target_tokens": tokens[1:],
                        "weights": [1.0] * (len(tokens) - 1),
                    },
                )
            )
        return out

    def train_step(self, rows: int = 2, length: int = 12, signal: bool = False) -> None:
        from tinker import types

        fwd = self.training.forward_backward(
            self._datums(self.index * 1000 + self.report.steps, rows, length), "cross_entropy"
        )
        opt = self.training.optim_step(types.AdamParams(learning_rate=1e-2))
        if signal:
            self.in_flight.set()
        # Bounded: a future orphaned by the kill must fail, and fast; never reach this timeout.
        fwd.result(timeout=FUTURE_TIMEOUT_S)
        opt.result(timeout=FUTURE_TIMEOUT_S)

    def in_flight_step(self) -> None:
        self.hold()
        self.train_step(*self.in_flight_batch, signal=True)

    def save(self, name: str) -> str:
        return self.training.save_state(name).result(timeout=120).path

    def probe_loss(self) -> float:
        from tinker import types

        tokens = PROBE[0]["input_ids"]
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
        )
        out = self.training.forward([datum], "cross_entropy").result(timeout=120)
        return float(out.metrics["loss:sum"])

    def probe_lost(self) -> str:
        try:
            self.probe_loss()
        except Exception as exc:  # noqa: BLE001 - the SDK raises its own error types
            return f"{type(exc).__name__}: {exc}"
        return "no error: the adapter survived"

    def resume(self, path: str) -> int:
        self.training = self.service.create_training_client_from_state_with_optimizer(path)
        self.report.run_ids.append(self.training.model_id)
        return int(path.rsplit("step-", 1)[1])

    def is_fault(self, exc: BaseException) -> bool:
        return self.killed_at is not None


def hold_together(tenants: list[Tenant], rows_tokens: tuple[int, int] = BIG_BATCH) -> list:
    """Every tenant sends its interrupted step (``rows_tokens`` long) at the same time (a
    barrier): on an idle machine the first ones to arrive would otherwise have finished theirs
    before the last one sent its own, and the kill would interrupt no step of theirs."""
    barrier = threading.Barrier(len(tenants))
    for tenant in tenants:
        tenant.all_held, tenant.in_flight_batch = barrier, rows_tokens
    return tenants


def start_tenants(tenants: list[Tenant]) -> list[threading.Thread]:
    threads = [threading.Thread(target=t.run, name=t.report.name, daemon=True) for t in tenants]
    for thread in threads:
        thread.start()
    return threads


def kill_mid_training(
    server: ServerProcess, tenants: list[Tenant], store: Any = None, fault: Any = None
) -> tuple[float, dict[str, dict]]:
    """Inject ``fault`` (default: SIGKILL the server and relaunch it) while every tenant's
    interrupted step is in flight (each has a checkpoint by then).

    With ``store`` (the server's KVStore) the fault also waits until the Tinker tenants' futures
    of that step are pending in it, so that the fault orphans them. Returns the seconds from the
    fault to the server being whole again, and every tenant's records (:func:`management`) read
    before the fault.
    """
    wait_until(
        lambda: (
            all(t.in_flight.is_set() for t in tenants)
            or any(t.report.failure is not None for t in tenants)
        ),
        300,
        "every tenant's interrupted step sent",
    )
    for tenant in tenants:
        if tenant.report.failure is not None:
            raise AssertionError(f"{tenant.report.name} failed") from tenant.report.failure
    before = {t.report.key: management(server, t.report.key) for t in tenants}
    if store is not None:
        owners = {tenant_of(t.report.key) for t in tenants if t.kind == "tinker"}
        wait_until(lambda: owners <= pending_owners(store), 30, "in-flight futures pending")
    killed = time.monotonic()
    for tenant in tenants:  # before the fault: a call it breaks may fail before it returns
        tenant.killed_at = killed
    (fault or relaunch)(server, tenants, killed)
    server.restarted.set()
    return time.monotonic() - killed, before


def mark_killed(tenants: list[Tenant], killed: float) -> None:
    for tenant in tenants:
        tenant.killed_at = killed
        tenant.killed.set()


def relaunch(server: ServerProcess, tenants: list[Tenant], killed: float) -> None:
    """The whole server SIGKILLed, then started again on the same config."""
    server.kill()
    mark_killed(tenants, killed)
    server.start()


def tenant_of(key: str) -> str:
    from twinkle.server.state import tenant_id_for_key

    return tenant_id_for_key(key)


def pending_owners(store: Any) -> set[str]:
    return {v["owner"] for _, v in store.scan("future/") if v.get("status") == "pending"}


def finish(tenants: list[Tenant], threads: list[threading.Thread], timeout_s: float) -> None:
    for tenant, thread in zip(tenants, threads):
        if not tenant.report.done.wait(timeout_s):
            raise TimeoutError(f"{tenant.report.name} hung (steps {tenant.report.steps})")
        thread.join(timeout=5)
        if tenant.report.failure is not None:
            raise AssertionError(f"{tenant.report.name} failed") from tenant.report.failure


def management(server: ServerProcess, key: str) -> dict[str, Any]:
    """Every session, run and checkpoint record ``key``'s tenant can list."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        runs = http.get("/api/v1/training_runs", params={"limit": 1000}).json()["training_runs"]
        sessions = http.get("/api/v1/sessions", params={"limit": 1000}).json()["sessions"]
        checkpoints = {
            r["training_run_id"]: [
                c["twinkle_path"]
                for c in http.get(
                    f"/api/v1/training_runs/{r['training_run_id']}/checkpoints"
                ).json()["checkpoints"]
            ]
            for r in runs
        }
    return {
        "runs": {r["training_run_id"]: r for r in runs},
        "sessions": sessions,
        "ckpt": checkpoints,
    }


def records_line(server: ServerProcess, tenants: list[Tenant], before: dict) -> str:
    """For the "[fault]" lines: every tenant's step count read from its final checkpoint, and
    the session / run / checkpoint records listed before the fault and after recovery."""

    def counts(listing: dict) -> list[int]:
        ckpts = sum(len(paths) for paths in listing["ckpt"].values())
        return [len(listing["sessions"]), len(listing["runs"]), ckpts]

    total = {"before": [0, 0, 0], "after": [0, 0, 0]}
    for tenant in tenants:
        key = tenant.report.key
        for when, listing in (("before", before[key]), ("after", management(server, key))):
            total[when] = [a + b for a, b in zip(total[when], counts(listing))]
    steps = [
        server.checkpoint_state(t.report.key, t.report.final_path)["cur_step"] for t in tenants
    ]
    return (
        f"steps {steps} (target {tenants[0].report.target}); sessions/runs/checkpoints "
        f"{total['before']} before the fault, {total['after']} after (none lost)"
    )


def check_recovered(server: ServerProcess, tenants, before: dict, lost: bool = True) -> None:
    """The survival rules of every fault: records kept, in-flight calls ended with a clear
    error, old checkpoints load with the same weights, adapters of a dead process reported lost
    (``lost``; else they survived), every tenant at exactly its target step."""
    import pytest

    for tenant in tenants:
        report = tenant.report
        after = management(server, report.key)
        # No session, run or checkpoint record lost.
        assert set(before[report.key]["sessions"]) <= set(after["sessions"]), report.name
        for run_id, paths in before[report.key]["ckpt"].items():
            assert set(paths) <= set(after["ckpt"][run_id]), (report.name, run_id)
        assert set(before[report.key]["runs"]) <= set(after["runs"])
        # In-flight calls ended with an error, never a hang; a Tinker future says why.
        assert not any("Timeout" in e for e in report.fault_errors), report.fault_errors
        assert report.fault_errors or (not lost and tenant.kind == "tinker"), report.name
        if lost and tenant.kind == "tinker":
            assert any("stopped (restarted or killed)" in e for e in report.fault_errors), (
                report.fault_errors
            )
        # The adapter that lived in the killed process is reported lost, never reset.
        if lost:
            assert report.lost_errors, f"{report.name} never saw the fault"
            assert all("lost" in e and "restart" in e for e in report.lost_errors), (
                report.lost_errors
            )
            first_run = report.run_ids[0]
            assert after["runs"][first_run]["status"] == "lost", after["runs"][first_run]
        else:
            assert all("survived" in e for e in report.lost_errors), report.lost_errors
        # Resumed from the checkpoint it had: same weights (same probe loss) as right after save.
        for path, cur_step in report.resumed_from:
            assert server.checkpoint_state(report.key, path)["cur_step"] == cur_step
            assert report.probe_resumed[path] == pytest.approx(report.probe_at[path], rel=1e-5)
        # Exactly the steps asked for, counted by the server's own checkpoint.
        assert server.checkpoint_state(report.key, report.final_path)["cur_step"] == report.target
        assert report.steps == report.target
