"""The concurrency and ordering tier: parallel clients (``asyncio.gather``) against one in-process
server, and randomized interleavings with a fixed seed, on memory, file and Redis persistence.

Our other suites send one call at a time in the expected order; these send them together, in
orders a hostile or unlucky tenant would, and check the rules that must hold under any
interleaving:

- a key holds at most ``per_token_model_limit`` adapters, a model at most ``max_loras``, however
  many creations race (native ``add_adapter_to_model`` and Tinker ``create_model``);
- operations on one checkpoint name are ordered: a listed checkpoint always loads, and a delete
  racing a save leaves either both done in some order, never a record without its files;
- expiry is one state: an expired checkpoint is gone from every route at once, for good;
- the snapshot prefix is refused at save time.

The randomized rounds of the default run take a few seconds per mode; ``test_*_long`` (slow)
runs many more rounds with the same seed scheme.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle_server"))

from redis_fixture import redis_url  # noqa: E402,F401 - a fixture

from twinkle.server.config import parse_config  # noqa: E402
from twinkle.server.process.local import build_local_server  # noqa: E402
from twinkle.server.state import FileStore, MemoryStore, RedisStore  # noqa: E402
from twinkle.server.state.records import EPHEMERAL_PREFIX  # noqa: E402
from twinkle.server.testing import KEYS, config_dict  # noqa: E402

BASE = "tiny/qwen3"
MODEL = f"/api/v1/model/{BASE}"
LIMIT = 3
SEED = 47


@pytest.fixture(params=["memory", "file", "redis"])
def store(request, tmp_path):
    if request.param == "memory":
        return MemoryStore("conc:")
    if request.param == "file":
        return FileStore(tmp_path / "state.json", "conc:")
    url = request.getfixturevalue("redis_url")
    return RedisStore(url, f"conc-{os.getpid()}-{time.time_ns()}:")


def build(tmp_path: Path, store: Any, limit: int = LIMIT, max_loras: int = 8):
    config = config_dict(backend="mock", max_loras=max_loras)
    config["applications"][0]["args"]["server_config"]["per_token_model_limit"] = limit
    config["storage"] = {"root": str(tmp_path / "storage")}
    return build_local_server(parse_config(config), store=store)


def http(server, who: str = "alice") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=server.app, raise_app_exceptions=False),
        base_url="http://test",
        headers={"Authorization": f"Bearer {KEYS[who]}"},
        timeout=30.0,
    )


async def add(client: httpx.AsyncClient, name: str) -> httpx.Response:
    return await client.post(
        f"{MODEL}/add_adapter_to_model", json={"adapter_name": name, "config": {"r": 4}}
    )


async def result(client: httpx.AsyncClient, reply: httpx.Response) -> dict:
    """The outcome of a Tinker future: its result, or ``{"error": ...}``."""
    assert reply.status_code == 200, reply.text
    rid = reply.json()["request_id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = (await client.post("/api/v1/retrieve_future", json={"request_id": rid})).json()
        if got.get("type") != "try_again":
            return got
        await asyncio.sleep(0.01)
    raise AssertionError(f"future {rid} never finished")


def active_runs(server, who: str = "alice") -> list[str]:
    from twinkle.server.state.paths import tenant_id_for_key

    runs, _ = server.context.state.list_runs(tenant_id_for_key(KEYS[who]), limit=1000)
    return [r.training_run_id for r in runs if r.status == "active"]


def slow_registry(server, rng: random.Random, most_s: float = 0.005) -> None:
    """Seeded random latency (up to ``most_s``) before each run creation and each checkpoint
    registration, as a slow store adds: it widens every window between a check and the write
    it guards, and between a save's files and its record."""
    registry = server.services["model"].registry
    for method in ("create_run", "add_checkpoint"):
        original = getattr(registry, method)

        def slowed(*args, _original=original, **kwargs):
            time.sleep(rng.random() * most_s)
            return _original(*args, **kwargs)

        setattr(registry, method, slowed)


# ---------------------------------------------------------------------------- adapter limits
def test_concurrent_native_creations_never_pass_the_per_key_limit(tmp_path, store):
    server = build(tmp_path, store)

    async def main():
        async with http(server) as alice, http(server, "bob") as bob:
            replies = await asyncio.gather(
                *(add(alice, f"a{i}") for i in range(6)), *(add(bob, f"b{i}") for i in range(2))
            )
            return [r.status_code for r in replies[:6]], replies

    codes, replies = asyncio.run(main())
    assert sorted(codes) == [200] * LIMIT + [400] * (6 - LIMIT)
    refused = [r.json()["error"] for r in replies[:6] if r.status_code == 400]
    assert all("already holds 3 adapters (per_token_model_limit)" in e for e in refused)
    assert [r.status_code for r in replies[6:]] == [200, 200]  # bob's own limit, untouched
    assert len(active_runs(server)) == LIMIT
    assert len(server.services["model"].adapters) == LIMIT + 2


def test_concurrent_tinker_create_model_in_one_session_never_passes_the_limit(tmp_path, store):
    server = build(tmp_path, store)

    async def main():
        async with http(server) as alice:
            sid = (await alice.post("/api/v1/create_session", json={})).json()["session_id"]
            replies = await asyncio.gather(
                *(
                    alice.post(
                        "/api/v1/create_model",
                        json={
                            "session_id": sid,
                            "model_seq_id": seq,
                            "base_model": BASE,
                            "lora_config": {"rank": 4},
                        },
                    )
                    for seq in range(6)
                )
            )
            return await asyncio.gather(*(result(alice, r) for r in replies))

    outcomes = asyncio.run(main())
    made = [o for o in outcomes if o.get("type") == "create_model"]
    refused = [o for o in outcomes if "error" in o]
    assert len(made) == LIMIT and len(refused) == 6 - LIMIT, outcomes
    assert all("per_token_model_limit" in o["error"] for o in refused)
    assert len(active_runs(server)) == LIMIT


def test_concurrent_creations_never_pass_max_loras(tmp_path, store):
    server = build(tmp_path, store, limit=10, max_loras=2)

    async def main():
        async with http(server) as alice, http(server, "bob") as bob:
            return await asyncio.gather(
                *(add(alice, f"a{i}") for i in range(3)), *(add(bob, f"b{i}") for i in range(3))
            )

    replies = asyncio.run(main())
    assert sorted(r.status_code for r in replies) == [200, 200, 503, 503, 503, 503]
    assert all("at capacity (max_loras=2)" in r.json()["error"] for r in replies if r.is_error)
    assert len(server.services["model"].adapters) == 2


def test_a_released_slot_can_be_taken_again_at_once(tmp_path, store):
    """The reservation that makes the limit atomic never holds a slot its run gave back."""
    server = build(tmp_path, store, limit=1)

    async def main():
        async with http(server) as alice:
            codes = []
            for i in range(3):
                codes.append((await add(alice, f"x{i}")).status_code)
                codes.append(
                    (
                        await alice.post(f"{MODEL}/remove_adapter", json={"adapter_name": f"x{i}"})
                    ).status_code
                )
            return codes

    assert asyncio.run(main()) == [200] * 6


@pytest.mark.parametrize("rounds", [6])
def test_random_adds_and_removes_keep_every_limit(tmp_path, store, rounds):
    _random_adds_and_removes(tmp_path, store, rounds)


@pytest.mark.slow
def test_random_adds_and_removes_keep_every_limit_long(tmp_path, store):
    _random_adds_and_removes(tmp_path, store, 60)


def _random_adds_and_removes(tmp_path: Path, store: Any, rounds: int) -> None:
    server = build(tmp_path, store, max_loras=7)
    rng = random.Random(SEED)
    slow_registry(server, random.Random(SEED + 1))

    async def jittered(call):
        await asyncio.sleep(rng.random() * 0.002)
        return await call

    async def main():
        async with http(server) as alice, http(server, "bob") as bob:
            for _ in range(rounds):
                calls = []
                for client in (alice, bob):
                    for name in rng.sample([f"n{i}" for i in range(6)], 5):
                        op = rng.choice(["add", "add", "add", "remove"])
                        calls.append(
                            add(client, name)
                            if op == "add"
                            else client.post(f"{MODEL}/remove_adapter", json={"adapter_name": name})
                        )
                replies = await asyncio.gather(*(jittered(c) for c in calls))
                assert all(r.status_code < 500 or r.status_code == 503 for r in replies), [
                    r.text for r in replies if r.status_code >= 500
                ]
                assert len(active_runs(server)) <= LIMIT
                assert len(active_runs(server, "bob")) <= LIMIT
                assert len(server.services["model"].adapters) <= 7

    asyncio.run(main())


# ---------------------------------------------------------------------------- checkpoint names
def _pause_between_files_and_record(server) -> threading.Event:
    """Force the interleaving that lost files: a save pauses after writing its files, before
    registering them, until a delete of its checkpoint has run (at most 0.5 s: a server that
    orders the delete after the save never runs it in that window). Returns the event set
    when a save reaches that point."""
    service, state = server.services["model"], server.context.state
    reached, deleted = threading.Event(), threading.Event()
    register, delete = service.registry.add_checkpoint, state.delete_checkpoint

    def paused_register(*args, **kwargs):
        reached.set()
        deleted.wait(timeout=0.5)
        return register(*args, **kwargs)

    def noted_delete(*args, **kwargs):
        try:
            return delete(*args, **kwargs)
        finally:
            deleted.set()

    service.registry.add_checkpoint = paused_register
    state.delete_checkpoint = noted_delete
    return reached


async def _until(event: threading.Event) -> None:
    deadline = time.monotonic() + 10
    while not event.is_set():
        assert time.monotonic() < deadline, "the save never reached its registration"
        await asyncio.sleep(0.001)


async def _save(client, name: str = "c", adapter: str = "a0") -> httpx.Response:
    return await client.post(f"{MODEL}/save", json={"adapter_name": adapter, "name": name})


async def _listed(client, run_id: str) -> list[str]:
    reply = await client.get(f"/api/v1/training_runs/{run_id}/checkpoints")
    return [c["checkpoint_id"] for c in reply.json()["checkpoints"]]


async def _load(client, path: str, adapter: str = "a0") -> httpx.Response:
    return await client.post(f"{MODEL}/load", json={"adapter_name": adapter, "path": path})


def test_a_delete_racing_a_save_of_the_same_name_never_leaves_a_record_without_files(
    tmp_path, store
):
    server = build(tmp_path, store)

    async def main():
        async with http(server) as alice:
            run_id = (await add(alice, "a0")).json()["result"]["training_run_id"]
            path = (await _save(alice)).json()["result"]["path"]
            reached = _pause_between_files_and_record(server)
            save = asyncio.ensure_future(_save(alice))
            await _until(reached)  # its files are written: now the delete
            gone = await alice.delete(f"/api/v1/training_runs/{run_id}/checkpoints/weights/c")
            saved = await save
            return run_id, path, saved, gone, await _listed(alice, run_id)

    run_id, path, saved, gone, listed = asyncio.run(main())
    assert path.endswith("/weights/c")
    assert saved.status_code == 200 and gone.status_code == 200
    # Ordered: the delete ran after the save it raced, so the name is gone, files and all.
    assert listed == []
    assert not list((tmp_path / "storage").glob("**/weights/c"))


def test_the_sweeper_never_deletes_a_name_saved_again_after_it_expired(tmp_path, store):
    from twinkle.server.gateway.app import housekeep_once

    server = build(tmp_path, store)
    state = server.context.state
    now = [time.time()]
    state.clock = lambda: now[0]

    async def main():
        async with http(server) as alice:
            run_id = (await add(alice, "a0")).json()["result"]["training_run_id"]
            path = (await _save(alice)).json()["result"]["path"]
            route = f"/api/v1/training_runs/{run_id}/checkpoints/weights/c"
            assert (await alice.put(f"{route}/ttl", json={"ttl_seconds": 60})).status_code == 200
            now[0] += 61
            reached = _pause_between_files_and_record(server)
            save = asyncio.ensure_future(_save(alice))
            await _until(reached)
            await housekeep_once(server.context, server.backends)
            assert (await save).status_code == 200
            return run_id, await _listed(alice, run_id), await _load(alice, path)

    run_id, listed, loaded = asyncio.run(main())
    assert listed == ["weights/c"]  # saved again after it expired: a new checkpoint, kept
    assert loaded.status_code == 200, loaded.text


@pytest.mark.parametrize("rounds", [12])
def test_random_saves_deletes_and_loads_of_one_name(tmp_path, store, rounds):
    _random_checkpoint_ops(tmp_path, store, rounds)


@pytest.mark.slow
def test_random_saves_deletes_and_loads_of_one_name_long(tmp_path, store):
    _random_checkpoint_ops(tmp_path, store, 120)


def _random_checkpoint_ops(tmp_path: Path, store: Any, rounds: int) -> None:
    """Rounds of saves, deletes, TTL changes and loads of one name sent together in a seeded
    random order and spacing; after every round each listed checkpoint loads, and no call ever
    answered a 5xx."""
    server = build(tmp_path, store)
    rng = random.Random(SEED)
    slow_registry(server, random.Random(SEED + 1), most_s=0.02)

    async def main():
        async with http(server) as alice:
            run_id = (await add(alice, "a0")).json()["result"]["training_run_id"]
            await add(alice, "a1")
            route = f"/api/v1/training_runs/{run_id}/checkpoints/weights/c"
            path = f"twinkle://{run_id}/weights/c"
            ops = {
                "save": lambda: _save(alice),
                "delete": lambda: alice.delete(route),
                "ttl": lambda: alice.put(f"{route}/ttl", json={"ttl_seconds": 3600}),
                "load": lambda: _load(alice, path, "a1"),
                "list": lambda: alice.get(f"/api/v1/training_runs/{run_id}/checkpoints"),
            }

            async def jittered(op):
                await asyncio.sleep(rng.random() * 0.01)
                return op, await ops[op]()

            for _ in range(rounds):
                chosen = ["save", "delete"] + rng.choices(list(ops), k=rng.randint(0, 3))
                replies = await asyncio.gather(*(jittered(op) for op in chosen))
                for op, reply in replies:
                    assert reply.status_code < 500, (op, reply.text)
                    assert reply.status_code in (200, 404), (op, reply.text)
                if "weights/c" in await _listed(alice, run_id):
                    loaded = await _load(alice, path, "a1")
                    assert loaded.status_code == 200, loaded.text

    asyncio.run(main())


# ---------------------------------------------------------------------------- reserved names
def test_a_reserved_snapshot_name_is_refused_at_save_time(tmp_path, store):
    server = build(tmp_path, store)

    async def main():
        async with http(server) as alice:
            run_id = (await add(alice, "a0")).json()["result"]["training_run_id"]
            refused = [
                await alice.post(
                    f"{MODEL}/save",
                    json={"adapter_name": "a0", "name": f"{EPHEMERAL_PREFIX}x", **extra},
                )
                for extra in ({"kind": "sampler"}, {"is_sampler": True}, {})
            ]
            internal = await alice.post(
                f"{MODEL}/save_checkpoint", json={"adapter_name": "a0", "name": "ok"}
            )
            return refused, internal, await _listed(alice, run_id)

    refused, internal, listed = asyncio.run(main())
    for reply in refused:
        assert reply.status_code == 400
        assert reply.json()["error"].startswith(
            f"save: name: names starting with '{EPHEMERAL_PREFIX}'"
        )
    assert internal.status_code == 404  # the routes' own save is not served over HTTP
    assert listed == []  # nothing was saved


# ---------------------------------------------------------------------------- expiry
def test_an_expired_checkpoint_is_gone_from_every_route_at_once(tmp_path, store):
    server = build(tmp_path, store)
    state = server.context.state
    now = [time.time()]
    state.clock = lambda: now[0]

    async def main():
        async with http(server) as alice:
            run_id = (await add(alice, "a0")).json()["result"]["training_run_id"]
            keep = (await _save(alice, "keep")).json()["result"]["path"]
            path = (await _save(alice, "short")).json()["result"]["path"]
            route = f"/api/v1/training_runs/{run_id}/checkpoints/weights/short"
            assert (await alice.put(f"{route}/ttl", json={"ttl_seconds": 60})).status_code == 200
            minted = (await alice.get(f"{route}/archive")).json()["url"]
            assert (await alice.get(minted.removeprefix("http://test"))).status_code == 200
            now[0] += 61  # expired; the sweeper has not run
            run = (await alice.get(f"/api/v1/training_runs/{run_id}")).json()
            replies = {
                "load": await _load(alice, path),
                "mint": await alice.get(f"{route}/archive"),
                "download": await alice.get(minted.removeprefix("http://test")),
                "ttl": await alice.put(f"{route}/ttl", json={"ttl_seconds": 3600}),
                "delete": await alice.delete(route),
                "info": await alice.get("/api/v1/checkpoint_info", params={"twinkle_path": path}),
            }
            return run_id, keep, run, replies, await _listed(alice, run_id)

    run_id, keep, run, replies, listed = asyncio.run(main())
    assert listed == ["weights/keep"]
    assert run["last_checkpoint"]["tinker_path"] == "tinker://" + keep.split("://", 1)[1]
    assert {op: r.status_code for op, r in replies.items()} == dict.fromkeys(replies, 404)
    # ...and it stays gone: the new TTL above did not bring it back.
    assert [c.name for c in state.list_checkpoints(_alice(), run_id)] == ["keep"]
    assert [c.name for c in state.expired_checkpoints()] == ["short"]  # for the sweeper only


def _alice() -> str:
    from twinkle.server.state.paths import tenant_id_for_key

    return tenant_id_for_key(KEYS["alice"])
