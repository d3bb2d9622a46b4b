"""Audit events and usage counters of ServerState, on every persistence backend."""

from __future__ import annotations

from twinkle.server.state import ServerState
from twinkle.server.state._activity import FLUSH_S, USAGE


def test_events_are_recorded_per_owner_and_survive_a_new_state(backend, clock):
    _, make = backend
    state = ServerState(make("t:"), clock=clock)
    session = state.create_session("alice", project_id="p1", display_name="nightly")
    run = state.create_run("alice", session.session_id, "base", lora_rank=4)
    state.add_checkpoint("alice", run.training_run_id, "weights", "s1", "/tmp/none", size_bytes=7)
    state.set_checkpoint_public("alice", run.training_run_id, "weights/s1", True)
    state.delete_checkpoint("alice", run.training_run_id, "weights/s1")
    state.assign_session_project("alice", session.session_id, "p2")
    state.finish_session("alice", session.session_id, "success", "done")
    state.finish_session("alice", session.session_id, "success")  # idempotent, not re-audited
    state.create_session("bob")

    again = ServerState(make("t:"), clock=clock)  # another replica, or after a restart
    events = [e.event for e in again.list_events("alice")]
    assert events == [
        "session_create",
        "checkpoint_create",
        "checkpoint_publish",
        "checkpoint_delete",
        "project_session_assign",
        "session_finish",
    ]
    assert [e.event for e in again.list_events("bob")] == ["session_create"]
    info = again.session_info("alice", session.session_id)
    assert (info.project_id, info.display_name, info.finish_reason) == ("p2", "nightly", "success")
    assert again.session_info("bob", session.session_id).project_id is None


def test_usage_is_counted_in_memory_and_flushed_cheaply(backend, clock):
    _, make = backend
    store = make("u:")
    state = ServerState(store, clock=clock)
    state.count_usage("alice", "training", 10, "base", "s")  # first count flushes at once
    state.count_usage("alice", "training", 5, "base", "s")
    state.count_usage("alice", "sampling_sample", 3, "base", "s")
    assert sum(v["token_count"] for _, v in store.scan(USAGE)) == 10  # the rest is in memory
    clock.advance(FLUSH_S)
    state.count_usage("bob", "training", 1)
    assert sum(v["token_count"] for _, v in store.scan(USAGE)) == 19
    other = ServerState(make("u:"), clock=clock)
    other.count_usage("alice", "training", 2, "base", "s")  # another replica adds its own
    buckets = {b.kind: b.token_count for b in state.usage_buckets("alice")}
    assert buckets == {"training": 17, "sampling_sample": 3}
    assert [b.token_count for b in state.usage_buckets("bob")] == [1]
    clock.advance(3600)
    state.count_usage("alice", "training", 4, "base", "s")
    hours = state.usage_buckets("alice", start=clock.now // 3600 * 3600)
    assert [(b.kind, b.token_count) for b in hours] == [("training", 4)]
