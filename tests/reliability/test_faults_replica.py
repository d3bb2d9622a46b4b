"""Faults of one Ray Serve replica (slow tier): under a real ``twinkle-server launch`` (Ray
Serve, its own Ray head), eight tenants (``TWINKLE_FAULT_TENANTS``; half ``twinkle_client``, half
``tinker`` SDK) train while ONE process is SIGKILLed:

- the gateway replica, with Tinker futures in flight (Serve starts a new replica);
- the model replica, mid-step (Serve starts a new one; every adapter it held is gone);
- one data-parallel worker actor of a ``dp_size: 2`` model, mid-step (the model replica lives).

Each tenant recovers the way a careful script does (``_fault_harness.Tenant``): its in-flight
call ends with an error, never a hang; it learns whether its adapter survived (an adapter that
lived in a dead process answers 410 "was lost"), and resumes from its newest checkpoint, so
its final step count, read from the server's own checkpoint, is exactly its target.

The rules these kills exercise are also checked in-process, in the default run (a data-parallel
worker lost mid-call, a lost adapter answering 410 on every call, a dead replica's 5xx).

Run with ``tools/run_fault_suite.sh`` (or ``pytest -m slow tests/reliability/test_faults_replica.py``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from twinkle.model import MockModel
from twinkle.parallel.errors import WorkerLostError
from twinkle.server.gateway.backends import HandleClient
from twinkle.server.model.registry import StateRunRegistry
from twinkle.server.model.service import ModelService
from twinkle.server.state import MemoryStore, ServerState
from twinkle.server.web.errors import Gone, InternalError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle_server"))

from _fault_harness import (  # noqa: E402
    NativeTenant,
    TinkerTenant,
    file_persistence,
    finish,
    hold_together,
    kill_mid_training,
    management,
    mark_killed,
    pending_owners,
    records_line,
    redis_persistence,
    start_tenants,
    tenant_of,
    wait_until,
)
from _fault_serve import ServeProcess  # noqa: E402
from redis_fixture import redis_url  # noqa: E402,F401 - a fixture

TARGET, EVERY = 6, 2
TENANTS = int(os.environ.get("TWINKLE_FAULT_TENANTS", "8"))  # half native, half Tinker


IN_FLIGHT = (64, 256)  # rows, tokens of the step the kill interrupts (longer than BIG_BATCH)


def tenants_of(server):
    """Half ``twinkle_client``, half Tinker, their interrupted steps sent together."""
    tenants = [
        (NativeTenant, TinkerTenant)[i % 2](server, i, TARGET, EVERY) for i in range(TENANTS)
    ]
    return hold_together(tenants, IN_FLIGHT)


def persistence_for(mode, tmp_path, request):
    if mode == "file":
        return file_persistence(tmp_path)
    prefix = f"faults-replica-{os.getpid()}-{time.time_ns()}:"
    return redis_persistence(request.getfixturevalue("redis_url"), prefix)


def check(server, tenants, before, lost: set[str], texts: tuple[str, ...], seen: str) -> None:
    """The survival rules: records kept; every error of the fault clear (never a timeout) and
    naming what happened (each contains one of ``texts``, and some tenant's ``seen``: a tenant
    whose step finished just before the kill meets the fault, if at all, on its next call);
    the adapters of the tenant kinds in ``lost`` reported lost (410, run status ``lost``), the
    others survived; checkpoints written before the kill load with the same weights; exactly
    the target step count."""
    errors = [e for t in tenants for e in t.report.fault_errors]
    assert any(seen in e for e in errors), (seen, errors)
    for tenant in tenants:
        report, kind = tenant.report, tenant.kind
        after = management(server, report.key)
        assert set(before[report.key]["sessions"]) <= set(after["sessions"]), report.name
        assert set(before[report.key]["runs"]) <= set(after["runs"]), report.name
        for run_id, paths in before[report.key]["ckpt"].items():
            assert set(paths) <= set(after["ckpt"][run_id]), (report.name, run_id)
        assert not any("imeout" in e for e in report.fault_errors), report.fault_errors
        assert all(any(t in e for t in texts) for e in report.fault_errors), report.fault_errors
        assert report.fault_errors or kind not in lost, f"{report.name}: no call failed"
        if kind in lost:
            assert report.lost_errors and all(
                "lost" in e and "resume" in e for e in report.lost_errors
            ), (report.name, report.lost_errors)
            if kind == "native":
                assert all(e.startswith("410") for e in report.lost_errors), report.lost_errors
            assert after["runs"][report.run_ids[0]]["status"] == "lost", report.name
        else:
            assert all("survived" in e for e in report.lost_errors), report.lost_errors
        for path, cur_step in report.resumed_from:
            assert server.checkpoint_state(report.key, path)["cur_step"] == cur_step
            assert report.probe_resumed[path] == pytest.approx(report.probe_at[path], rel=1e-5)
        assert server.checkpoint_state(report.key, report.final_path)["cur_step"] == report.target
        assert report.steps == report.target


def say(label, server, tenants, down_s, started, before, down="replica replaced"):
    print(
        f"\n[fault] {label}, {len(tenants)} tenants: {records_line(server, tenants, before)}; "
        f"{down} after {down_s:.1f} s "
        f"(server start {[round(s, 1) for s in server.starts]} s); per-tenant recovery "
        f"(kill -> first step) {[round(r, 1) for t in tenants for r in t.report.recovery_s]} s;"
        f" whole run {time.monotonic() - started:.0f} s; first errors "
        f"{sorted({t.report.fault_errors[0][:110] for t in tenants if t.report.fault_errors})}"
    )


def replica_kill(what, store):
    """SIGKILL one ``what`` process once some Tinker future is pending in ``store`` (all of
    them, as ``kill_mid_training`` can wait for, is a race: one may finish first), then wait
    until Serve has replaced it (not for a data-parallel worker: the next call rebuilds it)."""

    def fault(server, tenants, killed):
        owners = {tenant_of(t.report.key) for t in tenants if t.kind == "tinker"}
        wait_until(
            lambda: owners & pending_owners(store), 60, "a Tinker future pending", interval_s=0.01
        )
        pid = server.sigkill(what, index=1 if what == "dp_worker" else 0)
        mark_killed(tenants, killed)
        if what != "dp_worker":
            server.wait_replaced(what, pid)

    return fault


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("mode", ["file", "redis"])
def test_sigkill_of_the_gateway_replica_with_tinker_futures_in_flight(tmp_path, mode, request):
    server = ServeProcess(tmp_path, persistence_for(mode, tmp_path, request), TENANTS)
    started = time.monotonic()
    try:
        server.start()
        tenants = tenants_of(server)
        threads = start_tenants(tenants)
        fault = replica_kill("server", server.store())
        down_s, before = kill_mid_training(server, tenants, fault=fault)
        finish(tenants, threads, timeout_s=900)
        # Tinker futures ran in the dead gateway process: failed as orphaned when polled. The
        # adapters live in the model replica, which lived: none lost. twinkle_client calls go
        # to the model application and never pass the gateway.
        check(server, tenants, before, set(), ("stopped (restarted",), "stopped (restarted")
        say(f"gateway replica SIGKILL ({mode})", server, tenants, down_s, started, before)
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("mode", ["file", "redis"])
def test_sigkill_of_the_model_replica_mid_step(tmp_path, mode, request):
    server = ServeProcess(tmp_path, persistence_for(mode, tmp_path, request), TENANTS)
    started = time.monotonic()
    try:
        server.start()
        tenants = tenants_of(server)
        threads = start_tenants(tenants)
        fault = replica_kill("model", server.store())
        down_s, before = kill_mid_training(server, tenants, fault=fault)
        finish(tenants, threads, timeout_s=900)
        # In flight: a Tinker call's 5xx names the dead replica, a twinkle_client call's
        # connection broke; any later call: 410 lost.
        texts = ("model replica running this call stopped", "connection broke", "was lost")
        check(server, tenants, before, {"native", "tinker"}, texts, "model replica")
        say(f"model replica SIGKILL mid-step ({mode})", server, tenants, down_s, started, before)
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("mode", ["file", "redis"])
def test_sigkill_of_a_data_parallel_worker_mid_step(tmp_path, mode, request):
    server = ServeProcess(tmp_path, persistence_for(mode, tmp_path, request), TENANTS, dp_size=2)
    started = time.monotonic()

    try:
        server.start()
        model_pid = server.pids("model")
        tenants = tenants_of(server)
        threads = start_tenants(tenants)
        assert len(server.pids("dp_worker")) == 2, server.pids("dp_worker")
        fault = replica_kill("dp_worker", server.store())
        down_s, before = kill_mid_training(server, tenants, fault=fault)
        finish(tenants, threads, timeout_s=900)
        # The model replica lived and rebuilt its worker group: two workers again, one new.
        assert server.pids("model") == model_pid
        assert len(server.pids("dp_worker")) == 2
        texts = ("of the model died (its workers were restarted)",)  # "worker rank <r> ..."
        check(server, tenants, before, {"native", "tinker"}, texts, texts[0])
        label = f"data-parallel worker SIGKILL mid-step ({mode})"
        say(
            label,
            server,
            tenants,
            down_s,
            started,
            before,
            down="worker killed (group rebuilt by the next call)",
        )
    finally:
        server.stop()


# ---------------------------------------------------------------------------- the rules, in-process
FEATURES = [{"input_ids": list(range(10, 22)), "labels": list(range(10, 22))}]


class DyingWorkers(MockModel):
    """A data-parallel model (``recover()``, ``WorkerLostError``) whose rank 1 dies once in
    ``forward_backward``; like ``DataParallelModel``, ``recover()`` rebuilds every adapter
    that has a checkpoint (here: all) and reports it reloaded."""

    def __init__(self) -> None:
        super().__init__(model_id="tiny/qwen3", vocab_size=4096)
        self.die, self.dead, self.recovered = False, False, 0

    def forward_backward(self, inputs, adapter_name=None, **kwargs):
        if self.die or self.dead:
            self.die, self.dead = False, True
            raise WorkerLostError(1, "ActorDiedError")
        return super().forward_backward(inputs, adapter_name=adapter_name, **kwargs)

    def recover(self):
        if getattr(self, "fail_recover", False):
            self.fail_recover = False
            raise RuntimeError("no worker could be scheduled")
        self.recovered, self.dead = self.recovered + 1, False
        return {"reloaded": {name: "/ckpt" for name in self.list_adapters()}, "lost": {}}


def test_a_lost_data_parallel_worker_rebuilds_the_group_and_reports_every_adapter_lost(tmp_path):
    state = ServerState(MemoryStore("dp-lost:"))
    model = DyingWorkers()
    service = ModelService(model, "tiny/qwen3", StateRunRegistry(state, tmp_path))

    async def scenario():
        for owner in ("alice", "bob"):
            await service.call(owner, "add_adapter_to_model", {"config": {"r": 4}})
            await service.call(owner, "set_optimizer", {"optimizer": "Adam"})
            await service.call(owner, "forward_backward", {"inputs": FEATURES})
        saved = await service.call("alice", "save", {"name": "ck", "save_optimizer": True})
        await service.call("alice", "clip_grad_and_step", {})  # a step after the checkpoint
        model.die = True
        errors = []
        for owner, op in [("alice", "forward_backward"), ("alice", "forward_only")] + [
            ("bob", "forward_only"),
            ("bob", "forward_only"),
        ]:
            with pytest.raises(Gone) as lost:
                await service.call(owner, op, {"inputs": FEATURES})
            errors.append(lost.value)
        # The owner starts again from the checkpoint: the rebuilt group trains.
        await service.call("alice", "add_adapter_to_model", {"config": {"r": 4}})
        resumed = await service.call("alice", "resume_from_checkpoint", {"path": saved["path"]})
        await service.call("alice", "forward_backward", {"inputs": FEATURES})
        return saved["path"], errors, resumed

    path, errors, resumed = asyncio.run(scenario())
    assert model.recovered == 1  # one rebuild, however many calls met the loss
    # The in-flight call and every later one: 410 naming the worker, never a 500 or a 404,
    # never the reloaded checkpoint passed off as the adapter (it had trained a step since).
    for error in errors:
        assert error.status == 410 and "data-parallel worker rank 1" in error.message, error
    assert path in errors[0].message and "it had no checkpoint" in errors[2].message
    runs = sorted(state.list_runs("alice", limit=10)[0], key=lambda r: r.created_at)
    assert [r.status for r in runs] == ["lost", "active"]
    assert [r.status for r in state.list_runs("bob", limit=10)[0]] == ["lost"]
    assert resumed["cur_step"] == 0  # the checkpoint's step, the one after it lost
    assert model.list_adapters() == [service._internal("alice", "default")]


def test_workers_that_cannot_be_restarted_are_a_5xx_and_the_next_call_tries_again(tmp_path):
    model = DyingWorkers()
    service = ModelService(
        model, "tiny/qwen3", StateRunRegistry(ServerState(MemoryStore("dp:")), tmp_path)
    )

    async def scenario():
        await service.call("alice", "add_adapter_to_model", {"config": {"r": 4}})
        model.die, model.fail_recover = True, True
        with pytest.raises(InternalError) as failed:
            await service.call("alice", "forward_backward", {"inputs": FEATURES})
        with pytest.raises(Gone) as lost:  # workers restarted this time: the adapter is lost
            await service.call("alice", "forward_backward", {"inputs": FEATURES})
        return failed.value, lost.value

    failed, lost = asyncio.run(scenario())
    assert failed.status == 500 and failed.request_id in failed.message
    assert "could not be restarted" in failed.message
    assert lost.status == 410 and model.recovered == 1


def test_an_adapter_lost_in_a_restart_stays_410_on_every_call(tmp_path):
    state = ServerState(MemoryStore("lost-twice:"))
    registry = StateRunRegistry(state, tmp_path)
    first = ModelService(MockModel("tiny/qwen3", vocab_size=4096), "tiny/qwen3", registry)
    asyncio.run(first.call("alice", "add_adapter_to_model", {"config": {"r": 4}}))
    relaunched = ModelService(
        MockModel("tiny/qwen3", vocab_size=4096), "tiny/qwen3", registry, clock=lambda: 4e9
    )

    async def calls():
        statuses = []
        for _ in range(3):  # the first call marks the run lost; the later ones must still say so
            with pytest.raises(Gone) as lost:
                await relaunched.call("alice", "forward_only", {"inputs": FEATURES})
            statuses.append((lost.value.status, "was lost" in lost.value.message))
        return statuses

    assert asyncio.run(calls()) == [(410, True)] * 3


def test_a_call_whose_replica_died_is_a_5xx_that_says_so():
    from ray.exceptions import ActorDiedError

    class DeadHandle:
        class call:
            @staticmethod
            async def remote(*args):
                raise ActorDiedError()

    client = HandleClient("ModelManagement", "model")
    client._handle = DeadHandle()
    with pytest.raises(InternalError) as error:
        asyncio.run(client.call("alice", "forward_backward", {}))
    assert error.value.status == 500 and error.value.request_id
    assert "the model replica running this call stopped (killed or restarted)" in str(error.value)
    assert error.value.request_id in str(error.value)


def test_a_connection_broken_mid_call_is_a_client_error_not_a_raw_httpx_one():
    """A replica SIGKILLed mid-call resets its connection (direct ingress): twinkle_client
    raised httpx.ReadError itself; now a ServerUnavailableError (not NotConnectedError, which
    means "nothing was sent" and lets the client resend on the main address)."""
    import httpx

    from twinkle_client._http import HttpTransport, NotConnectedError
    from twinkle_client.errors import ServerUnavailableError

    def reset(request):
        raise httpx.ReadError("[Errno 104] Connection reset by peer", request=request)

    http = HttpTransport("http://replica", "k", transport=httpx.MockTransport(reset))
    with pytest.raises(ServerUnavailableError) as error:
        http.post("/api/v1/model/tiny/qwen3/forward_backward", {})
    assert not isinstance(error.value, NotConnectedError)
    assert "connection broke before the server answered" in str(error.value)
    assert "ReadError" in str(error.value)
