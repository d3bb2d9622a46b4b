"""ServerState over every backend: sessions, runs, futures, samplers, isolation and restarts."""

from __future__ import annotations

import pytest

from twinkle.server.state import (
    BadRequestError,
    ConflictError,
    FileStore,
    GoneError,
    NotFoundError,
    RedisStore,
    ServerState,
)

A, B = "tenant-a", "tenant-b"

pytestmark = pytest.mark.unit


@pytest.fixture
def state(store, clock) -> ServerState:
    return ServerState(store, clock=clock)


@pytest.fixture
def run(state):
    session = state.create_session(A, tags=["t"], user_metadata={"k": "v"}, sdk_version="0.38.0")
    return state.create_run(A, session.session_id, "base/model", lora_rank=8, model_seq_id=0)


def test_session_lifecycle(state, clock):
    session = state.create_session(A, tags=["x"], sdk_version="0.38.0")
    assert session.session_id.startswith("sess-") and session.created_at == clock.now
    clock.advance(5)
    assert state.heartbeat(A, session.session_id).last_heartbeat == clock.now
    assert [s.session_id for s in state.list_sessions(A)] == [session.session_id]
    assert state.finish_session(A, session.session_id).finished is True
    assert state.list_sessions(A) == []
    assert len(state.list_sessions(A, include_finished=True)) == 1
    with pytest.raises(GoneError) as err:
        state.heartbeat(A, session.session_id)
    assert err.value.status_code == 410


def test_expired_sessions(state, clock):
    old = state.create_session(A)
    clock.advance(100)
    fresh = state.create_session(B)
    done = state.create_session(A)
    state.finish_session(A, done.session_id)
    clock.advance(50)
    assert [s.session_id for s in state.expired_sessions(timeout=120)] == [old.session_id]
    state.heartbeat(A, old.session_id)
    assert state.expired_sessions(timeout=120) == []
    assert fresh.owner == B


def test_explicit_ids_are_never_overwritten(state):
    state.create_session(A, session_id="fixed")
    with pytest.raises(ConflictError):
        state.create_session(B, session_id="fixed")
    assert state.get_session(A, "fixed").owner == A


def test_run_lifecycle_and_paging(state, clock, run):
    assert run.training_run_id == f"{run.session_id}:train:0"
    assert (run.is_lora, run.status, run.corrupted) == (True, "active", False)
    with pytest.raises(ConflictError):
        state.create_run(A, run.session_id, "base/model", lora_rank=8, model_seq_id=0)
    for seq in range(1, 5):
        clock.advance(1)
        state.create_run(A, run.session_id, "base/model", lora_rank=4, model_seq_id=seq)
    page, total = state.list_runs(A, limit=2, offset=1)
    assert total == 5
    assert [r.model_seq_id for r in page] == [3, 2]
    clock.advance(10)
    assert state.touch_run(A, run.training_run_id).last_request_time == clock.now
    updated = state.update_run(A, run.training_run_id, status="unloaded", corrupted=True)
    assert (updated.status, updated.corrupted) == ("unloaded", True)
    assert state.get_run(A, run.training_run_id).status == "unloaded"
    with pytest.raises(BadRequestError):
        state.update_run(A, run.training_run_id, owner=B)
    with pytest.raises(BadRequestError):
        state.update_run(A, run.training_run_id, no_such_field=1)


def test_run_needs_live_own_session(state):
    session = state.create_session(A)
    with pytest.raises(NotFoundError):
        state.create_run(B, session.session_id, "base/model", lora_rank=8)
    state.finish_session(A, session.session_id)
    with pytest.raises(ConflictError):
        state.create_run(A, session.session_id, "base/model", lora_rank=8)


def test_futures(state, clock, run):
    future = state.create_future(A, "forward_backward", model_id=run.training_run_id)
    assert (future.status, future.queue_state) == ("pending", "active")
    assert state.count_active_futures() == 1
    assert state.count_active_futures(owner=B) == 0
    assert state.count_active_futures(model_id="other") == 0
    assert state.set_queue_state(A, future.request_id, "paused_rate_limit").queue_state == (
        "paused_rate_limit"
    )
    clock.advance(2)
    done = state.complete_future(
        A, future.request_id, result_b64="AAE=", content_type="application/x-protobuf"
    )
    assert (done.status, done.result_b64, done.finished_at) == ("done", "AAE=", clock.now)
    with pytest.raises(ConflictError):
        state.fail_future(A, future.request_id, "late")
    failed = state.fail_future(A, state.create_future(A, "optim_step").request_id, "bad", "user")
    assert failed.error.model_dump() == {"category": "user", "message": "bad"}
    assert state.count_active_futures() == 0
    pending = state.create_future(A, "asample")
    clock.advance(100)
    assert state.purge_futures(older_than=50) == 2
    assert state.get_future(A, pending.request_id).status == "pending"
    with pytest.raises(NotFoundError):
        state.get_future(A, future.request_id)


def test_sampling_sessions(state, run):
    sampler = state.create_sampling_session(
        A, run.session_id, base_model="base/model", model_path="twinkle://r/sampler_weights/s"
    )
    assert state.get_sampling_session(A, sampler.sampling_session_id) == sampler
    with pytest.raises(NotFoundError):
        state.create_sampling_session(B, run.session_id)


def test_counts(state, run):
    state.create_sampling_session(A, run.session_id)
    state.create_future(A, "forward_backward")
    other = state.create_session(B)
    state.finish_session(B, other.session_id)
    assert state.counts() == {
        "active_sessions": 1,
        "models": 1,
        "sampling_sessions": 1,
        "futures": 1,
    }


def test_another_owner_sees_nothing(state, run):
    ckpt, _ = state.add_checkpoint(A, run.training_run_id, "weights", "c1", "/data/c1")
    future = state.create_future(A, "optim_step")
    sampler = state.create_sampling_session(A, run.session_id)
    denied = [
        lambda: state.get_session(B, run.session_id),
        lambda: state.heartbeat(B, run.session_id),
        lambda: state.finish_session(B, run.session_id),
        lambda: state.get_run(B, run.training_run_id),
        lambda: state.touch_run(B, run.training_run_id),
        lambda: state.update_run(B, run.training_run_id, status="lost"),
        lambda: state.list_checkpoints(B, run.training_run_id),
        lambda: state.get_checkpoint(B, run.training_run_id, ckpt.checkpoint_id),
        lambda: state.delete_checkpoint(B, run.training_run_id, ckpt.checkpoint_id),
        lambda: state.set_checkpoint_public(B, run.training_run_id, ckpt.checkpoint_id, True),
        lambda: state.set_checkpoint_ttl(B, run.training_run_id, ckpt.checkpoint_id, 1),
        lambda: state.add_checkpoint(B, run.training_run_id, "weights", "x", "/x"),
        lambda: state.resolve_checkpoint_path(B, ckpt.path),
        lambda: state.get_future(B, future.request_id),
        lambda: state.complete_future(B, future.request_id, result={}),
        lambda: state.get_sampling_session(B, sampler.sampling_session_id),
    ]
    for call in denied:
        with pytest.raises(NotFoundError) as err:
            call()
        assert err.value.status_code == 404
    # The error a foreign record raises is the one a missing record raises.
    with pytest.raises(NotFoundError, match="^training run not found$"):
        state.get_run(B, run.training_run_id)
    with pytest.raises(NotFoundError, match="^training run not found$"):
        state.get_run(B, "no-such-run")
    assert state.list_sessions(B) == []
    assert state.list_runs(B) == ([], 0)
    assert state.get_run(A, run.training_run_id).status == "active"
    assert state.get_future(A, future.request_id).status == "pending"


@pytest.mark.parametrize("kind", ["file", pytest.param("redis", marks=pytest.mark.integration)])
def test_restart_keeps_everything(kind, tmp_path, request, clock):
    if kind == "file":
        make = lambda: FileStore(tmp_path / "state.json", "twinkle:")  # noqa: E731
    else:
        url = request.getfixturevalue("redis_url")
        make = lambda: RedisStore(url, "restart-test:")  # noqa: E731
    first = ServerState(make(), clock=clock)
    session = first.create_session(A)
    run = first.create_run(A, session.session_id, "base/model", lora_rank=8)
    ckpt, _ = first.add_checkpoint(A, run.training_run_id, "sampler_weights", "s1", "/d/s1")
    future = first.create_future(A, "save_weights")
    first.complete_future(A, future.request_id, result={"path": ckpt.path})
    sampler = first.create_sampling_session(A, session.session_id)
    del first

    second = ServerState(make(), clock=clock)
    assert second.get_session(A, session.session_id) == session
    assert second.get_run(A, run.training_run_id).last_sampler_checkpoint["tinker_path"] == (
        f"tinker://{run.training_run_id}/sampler_weights/s1"
    )
    assert second.resolve_checkpoint_path(A, ckpt.tinker_path) == ckpt
    assert second.get_future(A, future.request_id).result == {"path": ckpt.path}
    assert second.get_sampling_session(A, sampler.sampling_session_id) == sampler
    second.store.clear()
