"""The state store under faults: a Redis outage answers 503 naming the store (never a generic
500); resubmissions are recognised across gateway processes and restarts; old futures and the
sampler snapshots of finished sessions are cleaned up."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from twinkle.server.config import parse_config
from twinkle.server.process.local import build_local_server
from twinkle.server.state import MemoryStore, RedisStore, ServerState
from twinkle.server.state._futures import ORPHANED, ORPHANED_STATEFUL
from twinkle.server.state.errors import StoreUnavailableError
from twinkle.server.tinker.futures import TinkerFutures

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "twinkle_server"))
from redis_fixture import redis_url  # noqa: E402,F401 - a fixture

from twinkle.server.testing import KEYS, client, config_dict  # noqa: E402


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed on exit: nothing listens there


def _unreachable_client(password: str = "s3cret-pw") -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=_dead_port(),
        password=password,
        decode_responses=True,
        socket_connect_timeout=0.5,
        socket_timeout=0.5,
        # The store's own client retries with backoff (riding out a blip); a test need not wait.
        retry=Retry(NoBackoff(), 0),
    )


def test_every_store_call_during_an_outage_is_store_unavailable_naming_host_not_password():
    store = RedisStore(client=_unreachable_client(), key_prefix="outage:")
    calls = [
        lambda: store.get("a"),
        lambda: store.put("a", {"x": 1}),
        lambda: store.delete("a"),
        lambda: store.scan("a"),
        lambda: store.update("a", lambda v: v),
        lambda: store.clear(),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailableError) as caught:
            call()
        error = caught.value
        assert error.status == 503 and error.category == "server" and error.retry_after > 0
        assert "state store (Redis at 127.0.0.1:" in str(error) and "s3cret-pw" not in str(error)


def test_a_redis_outage_under_a_live_server_is_503_with_request_id_then_recovers(
    tmp_path,
    redis_url,  # noqa: F811 - the fixture
):
    config = config_dict(backend="mock")
    config["storage"] = {"root": str(tmp_path / "storage")}
    store = RedisStore(redis_url, key_prefix=f"outage-{time.time_ns()}:")
    server = build_local_server(parse_config(config), store=store)
    live = store._redis

    async def scenario():
        async with client(server) as alice:
            made = await alice.post("/api/v1/create_session", json={"tags": ["t"]})
            assert made.status_code == 200, made.text
            sessions_before = sorted(k for k, _ in store.scan("session/"))
            store._redis = _unreachable_client()  # Redis goes away
            down = await alice.post("/api/v1/create_session", json={"tags": ["t"]})
            beat = await alice.post(
                "/api/v1/session_heartbeat", json={"session_id": made.json()["session_id"]}
            )
            store._redis = live  # and comes back
            again = await alice.post("/api/v1/create_session", json={"tags": ["t"]})
            return down, beat, again, sessions_before

    down, beat, again, sessions_before = asyncio.run(scenario())
    for answer in (down, beat):
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["category"] == "server" and body["code"] == "Unavailable"
        assert "state store" in body["error"] and body["request_id"]
        assert float(answer.headers["retry-after"]) >= 1
    assert again.status_code == 200, again.text
    # The refused calls wrote nothing: only the session made afterwards is new.
    after = sorted(k for k, _ in store.scan("session/"))
    assert len(after) == len(sessions_before) + 1 and set(sessions_before) <= set(after)
    assert KEYS["alice"] not in down.text


# ----------------------------------------------------------------------------- resubmissions
def test_a_resubmission_reaching_a_new_gateway_process_answers_the_first_future():
    state = ServerState(MemoryStore("dedupe:"))
    runs: list[str] = []

    async def first_process() -> str:
        futures = TinkerFutures(state)

        async def runner():
            runs.append("first")
            return {"step": 1}

        rid = futures.submit("alice", "optim_step", runner, model_id="m", dedupe=[("idem", "k1")])
        await futures.wait("alice", rid, 5)
        return rid

    rid = asyncio.run(first_process())
    # A second gateway (another replica, or this one restarted) gets the SDK's retry.
    second = TinkerFutures(state)
    assert second.find("alice", [("idem", "k1")]) == rid
    assert state.get_future("alice", rid).result == {"step": 1} and runs == ["first"]
    # Keys are per tenant: bob's identical key is a new call.
    assert second.find("bob", [("idem", "k1")]) is None


def test_a_resubmission_of_a_future_orphaned_by_its_dead_process_runs_again_if_it_is_a_read():
    state = ServerState(MemoryStore("dedupe-orphan:"))
    state.store.put(
        "instance/gw-dead",
        {"host": socket.gethostname(), "pid": os.getpid(), "start": "0", "renewed_at": 0.0},
    )
    orphan = state.create_future("alice", "sample", "m", instance="gw-dead")
    state.remember_submission("alice", ("idem", "k2"), orphan.request_id)
    # The first submission can never finish and changed nothing: the retry must run.
    assert TinkerFutures(state).find("alice", [("idem", "k2")]) is None
    record = state.get_future("alice", orphan.request_id)
    assert record.status == "error" and record.error.message == ORPHANED
    # An orphaned training call may have run on its model replica after its gateway died: the
    # resubmission answers the failure (reload from a checkpoint), never a second step.
    step = state.create_future("alice", "optim_step", "m", instance="gw-dead")
    state.remember_submission("alice", ("idem", "k4"), step.request_id)
    assert TinkerFutures(state).find("alice", [("idem", "k4")]) == step.request_id
    record = state.get_future("alice", step.request_id)
    assert record.status == "error" and record.error.message == ORPHANED_STATEFUL
    assert "may have run" in record.error.message and "checkpoint" in record.error.message
    # A failure of the call itself is an answer, not a reason to run it again.
    failed = state.create_future("alice", "optim_step", "m", instance="gw-dead")
    state.fail_future("alice", failed.request_id, "bad input", category="user")
    state.remember_submission("alice", ("idem", "k3"), failed.request_id)
    assert TinkerFutures(state).find("alice", [("idem", "k3")]) == failed.request_id


class _StoreThatDies(MemoryStore):
    """A store whose writes fail while ``down`` (Redis SIGKILLed, then back from its AOF)."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailableError(
                "the state store (Redis at h:1) is unreachable", retry_after=1
            )

    def put(self, key, value):
        self._check()
        return super().put(key, value)

    def update(self, key, fn):
        self._check()
        return super().update(key, fn)


def test_a_call_that_ended_while_the_store_was_down_is_failed_saying_so_not_as_a_dead_process(
    monkeypatch,
):
    """The Redis SIGKILL fault test: calls that finished during the outage could not write their
    result, and, once Redis was back, were failed as "the server process ... stopped (restarted
    or killed)", though it never stopped. Now: failed as soon as the store takes the write,
    saying the outcome was not recorded and the call may have run, and not run again when
    resubmitted (it may have stepped the optimizer already)."""
    import twinkle.server.tinker.futures as futures_module

    monkeypatch.setattr(futures_module, "STORE_RETRY_S", 0.02, raising=False)
    store = _StoreThatDies("store-dies:")
    state = ServerState(store)
    ran: list[int] = []

    async def scenario():
        futures = TinkerFutures(state)

        async def runner():
            ran.append(1)
            store.down = True  # Redis dies while the call runs
            return {"step": 1}

        rid = futures.submit("alice", "optim_step", runner, model_id="m", dedupe=[("idem", "k")])
        await asyncio.sleep(0.2)
        pending = state.get_future("alice", rid).status  # reads work: only writes fail here
        store.down = False  # back
        record = await futures.wait("alice", rid, 5)
        return futures, rid, pending, record

    futures, rid, pending, record = asyncio.run(scenario())
    assert pending == "pending" and record.status == "error" and record.error.category == "server"
    assert "outcome could not be recorded (the state store" in record.error.message
    assert "may have run" in record.error.message and record.error.message != ORPHANED
    assert "stopped" not in record.error.message
    assert futures.find("alice", [("idem", "k")]) == rid and ran == [1]  # not run again


def test_old_futures_and_their_dedupe_records_are_purged_after_the_ttl():
    now = [1_000_000.0]
    state = ServerState(MemoryStore("purge:"), clock=lambda: now[0])
    record = state.create_future("alice", "optim_step", "m")
    state.remember_submission("alice", ("idem", "old"), record.request_id)
    state.complete_future("alice", record.request_id, result={})
    fresh = state.create_future("alice", "optim_step", "m")
    now[0] += 3600 + 1
    # What the gateway's housekeeping passes: the TTL, not an absolute time.
    assert state.purge_futures(older_than=3600) == 1
    assert [k for k, _ in state.store.scan("dedupe/")] == []
    assert state.get_future("alice", fresh.request_id).status == "pending"
