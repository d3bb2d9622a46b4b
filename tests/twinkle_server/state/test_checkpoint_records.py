"""Checkpoint records: retention, TTL, publishing and path resolution."""

from __future__ import annotations

import pytest

from twinkle.server.state import BadRequestError, ConflictError, NotFoundError, ServerState

A, B = "tenant-a", "tenant-b"

pytestmark = pytest.mark.unit


@pytest.fixture
def state(store, clock) -> ServerState:
    return ServerState(store, clock=clock)


@pytest.fixture
def run_id(state) -> str:
    session = state.create_session(A)
    return state.create_run(A, session.session_id, "base/model", lora_rank=8).training_run_id


def test_add_and_get(state, clock, run_id):
    record, evicted = state.add_checkpoint(A, run_id, "weights", "step-1", "/d/1", size_bytes=10)
    assert evicted == []
    assert record.checkpoint_id == "weights/step-1"
    assert record.checkpoint_type == "training"
    assert record.path == f"twinkle://{run_id}/weights/step-1"
    assert record.tinker_path == f"tinker://{run_id}/weights/step-1"
    assert state.get_checkpoint(A, run_id, "weights/step-1") == record
    last = state.get_run(A, run_id).last_checkpoint
    assert last["checkpoint_id"] == "weights/step-1" and last["size_bytes"] == 10
    assert state.get_run(A, run_id).last_sampler_checkpoint is None
    with pytest.raises(ConflictError):
        state.add_checkpoint(A, run_id, "weights", "step-1", "/d/1", overwrite=False)
    with pytest.raises(BadRequestError):
        state.add_checkpoint(A, run_id, "adapters", "x", "/d/x")
    with pytest.raises(BadRequestError):
        state.add_checkpoint(A, run_id, "weights", "../x", "/d/x")


def test_keep_last_evicts_oldest_of_the_same_kind(state, clock, run_id):
    evicted_names = []
    for step in range(5):
        clock.advance(1)
        _, evicted = state.add_checkpoint(A, run_id, "weights", f"w{step}", "/d", keep_last=2)
        evicted_names += [e.name for e in evicted]
        state.add_checkpoint(A, run_id, "sampler_weights", f"s{step}", "/d")
    assert evicted_names == ["w0", "w1", "w2"]
    kept = [c.checkpoint_id for c in state.list_checkpoints(A, run_id)]
    assert [k for k in kept if k.startswith("weights/")] == ["weights/w3", "weights/w4"]
    assert len([k for k in kept if k.startswith("sampler_weights/")]) == 5


def test_keep_last_spares_published_checkpoints(state, clock, run_id):
    state.add_checkpoint(A, run_id, "weights", "pinned", "/d")
    state.set_checkpoint_public(A, run_id, "weights/pinned", True)
    for step in range(3):
        clock.advance(1)
        state.add_checkpoint(A, run_id, "weights", f"w{step}", "/d", keep_last=1)
    names = [c.name for c in state.list_checkpoints(A, run_id)]
    assert names == ["pinned", "w2"]


def test_delete_moves_last_checkpoint_back(state, clock, run_id):
    state.add_checkpoint(A, run_id, "weights", "a", "/d/a")
    clock.advance(1)
    state.add_checkpoint(A, run_id, "weights", "b", "/d/b")
    assert state.delete_checkpoint(A, run_id, "weights/b").local_dir == "/d/b"
    assert state.get_run(A, run_id).last_checkpoint["checkpoint_id"] == "weights/a"
    state.delete_checkpoint(A, run_id, "weights/a")
    assert state.get_run(A, run_id).last_checkpoint is None
    with pytest.raises(NotFoundError):
        state.delete_checkpoint(A, run_id, "weights/a")


def test_ttl_expiry(state, clock, run_id):
    short, _ = state.add_checkpoint(A, run_id, "weights", "short", "/d", ttl_seconds=10)
    state.add_checkpoint(A, run_id, "weights", "forever", "/d")
    assert short.expires_at == clock.now + 10
    assert state.expired_checkpoints() == []
    clock.advance(10)
    assert [c.name for c in state.expired_checkpoints()] == ["short"]
    with pytest.raises(NotFoundError):
        state.resolve_checkpoint_path(A, short.path)
    # Expired is gone: no new TTL brings it back, every reader agrees, the sweeper deletes it.
    with pytest.raises(NotFoundError):
        state.set_checkpoint_ttl(A, run_id, "weights/short", None)
    with pytest.raises(NotFoundError):
        state.get_checkpoint(A, run_id, "weights/short")
    assert [c.name for c in state.list_checkpoints(A, run_id)] == ["forever"]
    assert state.delete_checkpoint(A, run_id, "weights/short").name == "short"
    assert state.expired_checkpoints() == []
    state.set_checkpoint_ttl(A, run_id, "weights/forever", 5)
    assert [c.name for c in state.expired_checkpoints(now=clock.now + 5)] == ["forever"]


def test_ephemeral_snapshots_of_a_finished_session_are_swept_before_their_ttl(state, run_id):
    from twinkle.server.state.records import EPHEMERAL_PREFIX

    snap, _ = state.add_checkpoint(
        A, run_id, "sampler_weights", EPHEMERAL_PREFIX + "1", "/d/e", ttl_seconds=86400
    )
    state.add_checkpoint(A, run_id, "sampler_weights", "named", "/d/n")
    state.add_checkpoint(A, run_id, "weights", "state", "/d/w")
    assert snap.ephemeral and state.expired_checkpoints() == []
    state.finish_session(A, state.get_run(A, run_id).session_id)
    # Only the snapshot made for the session's own sampling clients goes; saved ones stay.
    assert [c.name for c in state.expired_checkpoints()] == [EPHEMERAL_PREFIX + "1"]


def test_resolve_paths(state, run_id):
    record, _ = state.add_checkpoint(A, run_id, "sampler_weights", "s", "/d/s")
    assert state.resolve_checkpoint_path(A, f"twinkle://{run_id}/sampler_weights/s") == record
    assert state.resolve_checkpoint_path(A, f"tinker://{run_id}/sampler_weights/s") == record
    with pytest.raises(NotFoundError):
        state.resolve_checkpoint_path(A, f"twinkle://{run_id}/weights/s")
    for bad in [
        "s",
        f"http://{run_id}/sampler_weights/s",
        f"twinkle://{run_id}/sampler_weights",
        f"twinkle://{run_id}/sampler_weights/s/extra",
        f"twinkle://{run_id}/optimizer/s",
        f"twinkle://{run_id}/sampler_weights/..",
        "twinkle://../sampler_weights/s",
        "twinkle:///sampler_weights/s",
    ]:
        with pytest.raises(BadRequestError):
            state.resolve_checkpoint_path(A, bad)


def test_cross_owner_resolution_needs_publishing(state, run_id):
    record, _ = state.add_checkpoint(A, run_id, "weights", "w", "/d/w")
    with pytest.raises(NotFoundError):
        state.resolve_checkpoint_path(B, record.path)
    with pytest.raises(NotFoundError):
        state.resolve_checkpoint_path(B, record.path, allow_public=True)
    state.set_checkpoint_public(A, run_id, "weights/w", True)
    assert state.get_run(A, run_id).last_checkpoint["public"] is True
    with pytest.raises(NotFoundError):
        state.resolve_checkpoint_path(B, record.path)
    assert state.resolve_checkpoint_path(B, record.path, allow_public=True).owner == A
    with pytest.raises(NotFoundError):
        state.get_checkpoint(B, run_id, "weights/w")
