"""What one tenant may keep in the shared state: metadata caps, its total, compacted sessions.

Issue 47 item 10: sessions carried up to 8 MiB of ``user_metadata`` each and finished sessions
were kept forever, so 16 sessions made file persistence's ``state.json`` 136 MiB and another
tenant's ``create_session`` 1000x slower. Every test runs on memory, file and Redis persistence.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle_server"))

from redis_fixture import redis_url  # noqa: E402, F401 - fixture

from twinkle.server.state import (  # noqa: E402
    BadRequestError,
    FileStore,
    ForbiddenError,
    MemoryStore,
    NotFoundError,
    RedisStore,
    ServerState,
)
from twinkle.server.state.server_state import StateLimits  # noqa: E402
from twinkle.server.testing import client, local_server  # noqa: E402
from twinkle.server.web.errors import PayloadTooLarge  # noqa: E402

A, B = "tenant-a", "tenant-b"
KIB = 1024
LIMITS = StateLimits(
    max_metadata_bytes=4 * KIB,
    max_tenant_metadata_bytes=16 * KIB,
    keep_finished_sessions=3,
    finished_session_ttl_s=3600,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "file", pytest.param("redis", marks=pytest.mark.integration)])
def make_store(request, tmp_path):
    """``make()``: a fresh store of one backend (file: ``tmp_path/state.json``)."""
    made = []
    if request.param == "memory":
        root = MemoryStore("")  # one memory, as the Ray store actor gives every replica
        yield lambda: root.sibling("g:")
        return
    if request.param == "file":
        yield lambda: FileStore(tmp_path / "state.json", "g:")
        return
    url = request.getfixturevalue("redis_url")
    prefix = f"growth-{uuid.uuid4().hex[:8]}:"

    def make():
        made.append(RedisStore(url, prefix))
        return made[-1]

    yield make
    RedisStore(url, prefix).clear()
    for store in made:
        store.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def state(make_store, clock) -> ServerState:
    return ServerState(make_store(), clock=clock, limits=LIMITS)


def blob(size: int) -> dict:
    """``user_metadata`` taking exactly ``size`` bytes as compact JSON."""
    return {"b": "x" * (size - len('{"b":""}'))}


def test_metadata_over_the_cap_is_413_naming_the_limit_and_stores_nothing(state):
    with pytest.raises(PayloadTooLarge, match="max_metadata_bytes=4096") as err:
        state.create_session(A, user_metadata=blob(4 * KIB + 1))
    assert err.value.status == 413 and "user_metadata and tags" in str(err.value)
    with pytest.raises(PayloadTooLarge, match="max_metadata_bytes"):
        state.create_session(A, tags=["t" * 5000])
    session = state.create_session(A, user_metadata=blob(4 * KIB))  # exactly the cap: kept
    with pytest.raises(PayloadTooLarge, match="a training run"):
        state.create_run(A, session.session_id, "m", 8, user_metadata=blob(4 * KIB + 1))
    assert [s.session_id for s in state.list_sessions(A)] == [session.session_id]
    assert state.list_runs(A) == ([], 0)
    assert state.stored_metadata_bytes(A) == 4 * KIB


def test_descriptive_strings_are_bounded(state):
    with pytest.raises(BadRequestError, match="display_name is 5000 characters; at most 1024"):
        state.create_session(A, display_name="n" * 5000)
    assert state.list_sessions(A, include_finished=True) == []
    session = state.create_session(A)
    state.finish_session(A, session.session_id, "errored", "trace\n" * 10_000)
    assert len(state.session_info(A, session.session_id).finish_detail) == 4096


def test_a_tenants_total_is_403_while_its_live_sessions_hold_it(state):
    live = [state.create_session(A, user_metadata=blob(4 * KIB)) for _ in range(4)]
    with pytest.raises(ForbiddenError, match="max_tenant_metadata_bytes=16384") as err:
        state.create_session(A, user_metadata=blob(100))
    assert err.value.status == 403 and "16384 bytes" in str(err.value)
    assert len(state.list_sessions(A)) == 4  # nothing created
    state.create_session(A)  # no metadata: nothing to count
    state.create_session(B, user_metadata=blob(4 * KIB))  # another tenant has its own total
    # Finishing one makes room: the new session compacts it (oldest finished first).
    state.finish_session(A, live[0].session_id)
    state.create_session(A, user_metadata=blob(4 * KIB))
    with pytest.raises(NotFoundError):
        state.get_session(A, live[0].session_id)
    assert state.stored_metadata_bytes(A) == 16 * KIB


def test_finished_sessions_past_the_kept_count_or_ttl_are_compacted(state, clock):
    ids = []
    for i in range(6):
        clock.now += 1
        session = state.create_session(A, user_metadata={"i": i}, display_name=f"s{i}")
        run = state.create_run(A, session.session_id, "m", 8, user_metadata={"run": i})
        sampler = state.create_sampling_session(A, session.session_id, base_model="m")
        state.finish_session(A, session.session_id)
        ids.append((session.session_id, run.training_run_id, sampler.sampling_session_id))
    kept = [s.session_id for s in state.list_sessions(A, include_finished=True)]
    assert kept == [sid for sid, _, _ in ids[-3:]]
    gone_sid, gone_run, gone_sampler = ids[0]
    assert state.session_info(A, gone_sid).display_name is None
    with pytest.raises(NotFoundError):
        state.get_sampling_session(A, gone_sampler)
    run = state.get_run(A, gone_run)  # kept for its checkpoints, without its metadata
    assert run.user_metadata == {} and state.get_run(A, ids[-1][1]).user_metadata == {"run": 5}
    # Only the kept sessions and their runs are counted.
    assert state.stored_metadata_bytes(A) == 3 * (len('{"i":0}') + len('{"run":0}'))
    clock.now += LIMITS.finished_session_ttl_s + 10
    assert sorted(state.compact_sessions()) == sorted(sid for sid, _, _ in ids[-3:])
    assert state.list_sessions(A, include_finished=True) == []
    assert state.stored_metadata_bytes(A) == 0


def test_a_stale_ledger_entry_is_dropped_when_room_is_needed(state, clock):
    # What a crash between counting a record and creating it leaves behind.
    state.store.put("quota/" + A, {"owner": A, "records": {"session/lost": [16 * KIB, clock.now]}})
    with pytest.raises(ForbiddenError):
        state.create_session(A, user_metadata=blob(100))  # too fresh: may be about to exist
    clock.now += 61
    state.create_session(A, user_metadata=blob(100))
    assert state.stored_metadata_bytes(A) == 100


def test_the_total_holds_under_concurrent_creates(make_store, clock):
    states = [ServerState(make_store(), clock=clock, limits=LIMITS) for _ in range(4)]

    def create(i: int) -> bool:
        try:
            states[i % 4].create_session(A, user_metadata=blob(3 * KIB))
            return True
        except ForbiddenError:
            return False

    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(create, range(12)))
    assert sum(made) == 5  # 5 x 3 KiB fit in 16 KiB, a sixth would not
    assert len(states[0].list_sessions(A)) == 5
    assert states[0].stored_metadata_bytes(A) == 15 * KIB


def test_one_tenant_cannot_grow_the_file_state_past_its_bound(tmp_path, clock):
    state = ServerState(FileStore(tmp_path / "state.json", "g:"), clock=clock, limits=LIMITS)
    for _ in range(40):
        clock.now += 1
        session = state.create_session(A, user_metadata=blob(4 * KIB))
        state.finish_session(A, session.session_id)
    size = (tmp_path / "state.json").stat().st_size
    # 3 finished sessions' 4 KiB of metadata, plus small records (audit events: 2 per session).
    assert size < 3 * 4 * KIB + 40 * 2 * 300 + 4 * KIB, size
    assert len(state.list_sessions(A, include_finished=True)) == 3


def test_the_route_answers_413_with_the_limit(tmp_path):
    server = local_server(tmp_path, backend="mock")

    async def main():
        async with client(server) as http:
            big = await http.post(
                "/api/v1/create_session", json={"user_metadata": {"b": "x" * (1 << 20)}}
            )
            small = await http.post("/api/v1/create_session", json={"user_metadata": {"k": "v"}})
            return big, small

    big, small = asyncio.run(main())
    assert big.status_code == 413, big.text
    assert "max_metadata_bytes=65536" in big.text
    assert small.status_code == 200
