"""Faults, the fast part: the whole server SIGKILLed mid-training and relaunched (file and Redis
persistence), with tenants of both clients training through it; plus the recovery rules that the
kill exercises, checked in-process (orphaned futures, lost adapters, a full disk mid-checkpoint).

Redis itself killed is in ``test_faults_slow.py``; the Ray kills (gateway replica, model replica,
a data-parallel worker) with eight tenants are in ``test_faults_replica.py``; all of them run
through ``tools/run_fault_suite.sh``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from twinkle.server.model.registry import StateRunRegistry
from twinkle.server.model.service import ModelService
from twinkle.server.state import MemoryStore, ServerState
from twinkle.server.tinker.futures import TinkerFutures
from twinkle.server.web.errors import Gone

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle_server"))

from _fault_harness import (  # noqa: E402
    BASE,
    KEYS,
    NativeTenant,
    ServerProcess,
    TinkerTenant,
    check_recovered,
    file_persistence,
    finish,
    kill_mid_training,
    pending_owners,
    redis_persistence,
    start_tenants,
    tenant_of,
    wait_until,
)
from redis_fixture import redis_url  # noqa: E402,F401 - a fixture

from twinkle.server.testing import client as inprocess_client  # noqa: E402
from twinkle.server.testing import local_server  # noqa: E402

TARGET, EVERY = 4, 2


@pytest.mark.integration
# The file store in the default run; the same kill with Redis (its server start costs as much
# again) runs in the slow tier with the 8-tenant runs.
@pytest.mark.parametrize("mode", ["file", pytest.param("redis", marks=pytest.mark.slow)])
def test_sigkill_of_the_whole_server_mid_training(tmp_path, mode, request):
    persistence = file_persistence(tmp_path)
    if mode == "redis":
        url = request.getfixturevalue("redis_url")
        persistence = redis_persistence(url, f"faults-{os.getpid()}-{time.time_ns()}:")
    server = ServerProcess(tmp_path, persistence)
    server.start()
    try:
        tenants = [NativeTenant(server, 0, TARGET, EVERY), TinkerTenant(server, 1, TARGET, EVERY)]
        threads = start_tenants(tenants)
        store = server.store()
        down_s, before = kill_mid_training(server, tenants, store)
        finish(tenants, threads, timeout_s=240)
        check_recovered(server, tenants, before)
        for t in tenants:
            print(t.report)
        print(
            f"\n[fault] whole-server SIGKILL ({mode}): down {down_s:.1f} s, starts "
            f"{[round(s, 1) for s in server.starts]} s, recovery "
            f"{[[round(r, 1) for r in t.report.recovery_s] for t in tenants]} s, errors "
            f"{[t.report.fault_errors[:1] for t in tenants]}"
        )
    finally:
        server.stop()


# ---------------------------------------------------------------------------- recovery rules
def test_a_future_whose_gateway_process_died_fails_at_once_instead_of_pending_forever():
    state = ServerState(MemoryStore("orphan:"))
    # Gateway process A ran the future and was SIGKILLed: its lease names a process that is
    # not running any more (same host, another start time).
    state.store.put(
        "instance/gw-dead",
        {"host": socket.gethostname(), "pid": os.getpid(), "start": "0", "renewed_at": 0.0},
    )
    orphan = state.create_future("alice", "forward_backward", "m", instance="gw-dead")
    # Gateway B (the relaunched server) is asked for it.
    futures = TinkerFutures(state)

    async def poll():
        started = time.monotonic()
        record = await futures.wait("alice", orphan.request_id, timeout=20)
        return record, time.monotonic() - started

    record, waited = asyncio.run(poll())
    assert record.status == "error" and record.error.category == "server"
    assert "stopped (restarted or killed)" in record.error.message
    assert "resubmit" in record.error.message
    assert waited < 2.0  # not the 20 s long poll, let alone forever
    # A live gateway's futures are left alone: on another host, within its lease.
    state.store.put(
        "instance/gw-far", {"host": "elsewhere", "pid": 1, "start": "1", "renewed_at": time.time()}
    )
    live = state.create_future("alice", "forward_backward", "m", instance="gw-far")
    assert futures.settle("alice", state.get_future("alice", live.request_id)).status == "pending"
    # ...and failed once that lease expires.
    state.store.put(
        "instance/gw-far", {"host": "elsewhere", "pid": 1, "start": "1", "renewed_at": 0.0}
    )
    assert futures.settle("alice", state.get_future("alice", live.request_id)).status == "error"


def test_this_process_holds_a_live_lease_while_its_futures_run():
    state = ServerState(MemoryStore("lease:"))
    futures = TinkerFutures(state)

    async def scenario():
        gate = asyncio.Event()

        async def runner():
            await gate.wait()
            return {"ok": True}

        rid = futures.submit("alice", "forward_backward", runner, model_id="m")
        assert state.get_future("alice", rid).instance == futures.instance
        assert state.instance_alive(futures.instance)
        assert (await futures.wait("alice", rid, 0.05)).status == "pending"
        gate.set()
        return await futures.wait("alice", rid, 5)

    assert asyncio.run(scenario()).result == {"ok": True}


@pytest.fixture(scope="module")
def shared_model():
    from twinkle.model import MultiLoraTransformersModel

    return MultiLoraTransformersModel("tiny://qwen3")


def test_an_adapter_lost_in_a_restart_is_reported_lost_never_fresh(shared_model, tmp_path):
    now = [1000.0]
    state = ServerState(MemoryStore("lost:"), clock=lambda: now[0])
    features = [{"input_ids": list(range(10, 22)), "labels": list(range(10, 22))}]

    def service():
        for name in list(shared_model.tenants):
            shared_model.remove_adapter(name)
        registry = StateRunRegistry(state, tmp_path)
        return ModelService(
            shared_model, "tiny/qwen3", registry, per_token_model_limit=1, clock=lambda: now[0]
        )

    async def before_the_kill():
        first = service()
        await first.call("alice", "add_adapter_to_model", {"adapter_name": "a", "config": {"r": 4}})
        await first.call("alice", "set_optimizer", {"adapter_name": "a", "optimizer": "Adam"})
        await first.call("alice", "forward_backward", {"adapter_name": "a", "inputs": features})
        await first.call("alice", "clip_grad_and_step", {"adapter_name": "a"})
        return await first.call(
            "alice", "save", {"adapter_name": "a", "name": "ck", "save_optimizer": True}
        )

    saved = asyncio.run(before_the_kill())["path"]
    run_id = saved.split("://", 1)[1].split("/", 1)[0]

    async def after_the_restart():
        now[0] = 2000.0  # the relaunched process starts later
        relaunched = service()
        with pytest.raises(Gone) as lost:
            await relaunched.call(
                "alice", "forward_only", {"adapter_name": "a", "inputs": features}
            )
        # The same name again is a NEW adapter the owner asked for (and the lost run, holding no
        # adapter, does not use up the key's per_token_model_limit of 1).
        await relaunched.call(
            "alice", "add_adapter_to_model", {"adapter_name": "a", "config": {"r": 4}}
        )
        progress = await relaunched.call(
            "alice", "resume_from_checkpoint", {"adapter_name": "a", "path": saved}
        )
        return lost.value, progress

    error, progress = asyncio.run(after_the_restart())
    assert error.status == 410 and error.category == "user"
    assert f"adapter 'a' (training run {run_id}) was lost" in error.message
    assert "restarted" in error.message and saved in error.message
    assert state.get_run("alice", run_id).status == "lost"
    assert progress["cur_step"] == 1


def test_disk_full_mid_checkpoint_keeps_the_previous_one_and_lists_no_broken_one(
    tmp_path, monkeypatch
):
    import twinkle.model.engine._checkpoints as writer

    server = local_server(tmp_path)
    route = "/api/v1/model/tiny/qwen3"
    features = [{"input_ids": list(range(10, 22)), "labels": list(range(10, 22))}]
    real_save_file = writer.save_file

    def full_disk(tensors, filename, *args, **kwargs):
        with open(filename, "wb") as out:  # a partial file, then the disk is full
            out.write(b"\0" * 128)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)

    async def scenario():
        async with inprocess_client(server) as http:

            async def post(op, **body):
                return await http.post(f"{route}/{op}", json={"adapter_name": "a", **body})

            run = (await post("add_adapter_to_model", config={"r": 4})).json()
            run_id = run["result"]["training_run_id"]
            await post("set_optimizer", optimizer="Adam", lr=1e-2)
            await post("forward_backward", inputs=features)
            await post("clip_grad_and_step")
            good = (await post("save", name="good", save_optimizer=True)).json()["result"]["path"]
            probe = (await post("forward_only", inputs=features)).json()["result"]["loss"]
            await post("forward_backward", inputs=features)
            await post("clip_grad_and_step")
            monkeypatch.setattr(writer, "save_file", full_disk)
            full = await post("save", name="good", save_optimizer=True)  # overwrite: must not
            broken = await post("save", name="broken", save_optimizer=True)
            monkeypatch.setattr(writer, "save_file", real_save_file)
            listed = (await http.get(f"/api/v1/training_runs/{run_id}/checkpoints")).json()
            await post("add_adapter_to_model", adapter_name="b", config={"r": 4})
            body = {"adapter_name": "b", "path": good}
            loaded = await http.post(f"{route}/resume_from_checkpoint", json=body)
            body = {"adapter_name": "b", "inputs": features}
            again = (await http.post(f"{route}/forward_only", json=body)).json()["result"]
            return full, broken, listed, loaded, good, probe, again["loss"]

    full, broken, listed, loaded, good, probe, again = asyncio.run(scenario())
    for failed in (full, broken):
        assert failed.status_code == 507, failed.text
        assert "no space left" in failed.json()["error"].lower()
        assert failed.json()["request_id"]
    assert [c["twinkle_path"] for c in listed["checkpoints"]] == [good]
    assert loaded.status_code == 200 and loaded.json()["result"]["cur_step"] == 1
    assert again == pytest.approx(probe, rel=1e-6)
    run_dir = tmp_path / "storage"
    leftovers = [p.name for p in run_dir.rglob("*") if p.is_dir() and ".tmp-" in p.name]
    assert leftovers == [] and not any(p.name == "broken" for p in run_dir.rglob("*"))


@pytest.mark.integration
def test_a_sample_in_flight_through_a_whole_server_kill_is_resubmitted_by_the_sdk(tmp_path):
    """The unmodified tinker SDK's sampling client rides a SIGKILL of the whole server out by
    itself: its sample's future is orphaned by the kill, the relaunched server answers it 410
    (a sample changes nothing, so running it again is safe), and the SDK sends the same sample
    again; the caller just gets its sequences. (The in-process version with a simulated dead
    process: tests/twinkle_server/tinker/test_tinker_orphaned_sample.py.)"""
    import threading

    import tinker
    from tinker import types

    from twinkle_client import init_tinker_client

    init_tinker_client()
    server = ServerProcess(tmp_path, file_persistence(tmp_path), sampler=True)
    server.start()
    try:
        service = tinker.ServiceClient(base_url=server.url, api_key=KEYS[0])
        training = service.create_lora_training_client(base_model=BASE, rank=4).result(timeout=120)
        path = training.save_weights_for_sampler("before-kill").result(timeout=120).path
        sampler = service.create_sampling_client(model_path=path)
        # Long enough (many tokens, several sequences) that the kill finds it running.
        params = types.SamplingParams(max_tokens=400, temperature=1.0, seed=3)
        prompt = types.ModelInput.from_ints([11, 200, 3000, 45])
        outcome: dict = {}

        def sample() -> None:
            try:
                outcome["result"] = sampler.sample(
                    prompt=prompt, num_samples=8, sampling_params=params
                ).result(timeout=300)
            except BaseException as exc:  # noqa: BLE001 - reported below
                outcome["error"] = exc

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        store = server.store()
        wait_until(lambda: tenant_of(KEYS[0]) in pending_owners(store), 60, "the sample pending")
        (orphan,) = [k for k, v in store.scan("future/") if v.get("status") == "pending"]
        killed = time.monotonic()
        server.kill()
        server.start()
        thread.join(timeout=300)
        answered_s = time.monotonic() - killed
        assert not thread.is_alive(), "the sample never answered"
        assert "error" not in outcome, outcome.get("error")
        sequences = outcome["result"].sequences
        assert len(sequences) == 8 and all(s.tokens for s in sequences)
        # The first submission ended as orphaned; the SDK's own second one ran.
        futures = dict(store.scan("future/"))
        assert futures[orphan]["status"] == "error"
        ran = [v for k, v in futures.items() if k != orphan and v.get("kind") == "sample"]
        assert any(v.get("status") == "done" for v in ran), futures
        print(
            f"\n[fault] sample in flight through a whole-server SIGKILL (file): resubmitted by "
            f"the SDK, answered {answered_s:.1f} s after the kill (relaunch "
            f"{server.starts[-1]:.1f} s)"
        )
    finally:
        server.stop()
