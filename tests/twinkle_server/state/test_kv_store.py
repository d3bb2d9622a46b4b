"""The KVStore contract, run unchanged over memory, file and a real Redis server."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from twinkle.server.state import (
    FileStore,
    KVStore,
    MemoryStore,
    RedisStore,
    clear_persistence,
    create_store,
)

pytestmark = pytest.mark.unit


def _increment(current: dict | None) -> dict:
    return {"n": (current or {"n": 0})["n"] + 1}


def test_put_get_delete(store: KVStore):
    assert store.get("a") is None
    store.put("a", {"x": 1, "nested": {"list": [1, "two", None]}})
    assert store.get("a") == {"x": 1, "nested": {"list": [1, "two", None]}}
    store.put("a", {"x": 2})
    assert store.get("a") == {"x": 2}
    assert store.delete("a") is True
    assert store.delete("a") is False
    assert store.get("a") is None


def test_values_are_copies(store: KVStore):
    value = {"items": [1]}
    store.put("k", value)
    value["items"].append(2)
    got = store.get("k")
    got["items"].append(3)
    assert store.get("k") == {"items": [1]}


def test_values_must_be_json_objects(store: KVStore):
    with pytest.raises(TypeError):
        store.put("k", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.put("k", {"raw": b"bytes"})
    assert store.get("k") is None


def test_scan_by_prefix_sorted(store: KVStore):
    for key in ["run/b", "run/a", "run/a/x", "session/1", "runner"]:
        store.put(key, {"key": key})
    assert [k for k, _ in store.scan("run/")] == ["run/a", "run/a/x", "run/b"]
    assert store.scan("run/a")[0] == ("run/a", {"key": "run/a"})
    assert len(store.scan("")) == 5
    assert store.scan("nothing/") == []


def test_scan_treats_glob_characters_literally(store: KVStore):
    store.put("a*b/1", {"v": 1})
    store.put("axb/1", {"v": 2})
    store.put("a[x]/1", {"v": 3})
    assert store.scan("a*") == [("a*b/1", {"v": 1})]
    assert store.scan("a[x]") == [("a[x]/1", {"v": 3})]


def test_update_creates_modifies_and_deletes(store: KVStore):
    assert store.update("c", _increment) == {"n": 1}
    assert store.update("c", _increment) == {"n": 2}
    assert store.get("c") == {"n": 2}
    assert store.update("c", lambda current: None) is None
    assert store.get("c") is None


def test_update_aborts_when_fn_raises(store: KVStore):
    store.put("c", {"n": 5})

    def refuse(current):
        raise ValueError("no")

    with pytest.raises(ValueError):
        store.update("c", refuse)
    assert store.get("c") == {"n": 5}


def test_update_is_atomic_across_threads(backend):
    _, make = backend
    stores = [make("app:") for _ in range(4)]
    errors: list[BaseException] = []

    def worker(s: KVStore) -> None:
        try:
            for _ in range(50):
                s.update("counter", _increment)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert stores[0].get("counter") == {"n": 200}


def _process_worker(kind: str, location: str, prefix: str, count: int) -> None:
    s = FileStore(location, prefix) if kind == "file" else RedisStore(location, prefix)
    for _ in range(count):
        s.update("counter", _increment)


@pytest.mark.parametrize("kind", ["file", pytest.param("redis", marks=pytest.mark.integration)])
def test_update_is_atomic_across_processes(kind, tmp_path, request):
    if kind == "file":
        location, prefix = str(tmp_path / "state.json"), "app:"
        reader: KVStore = FileStore(location, prefix)
    else:
        location, prefix = request.getfixturevalue("redis_url"), "mp-test:"
        reader = RedisStore(location, prefix)
        reader.clear()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_process_worker, args=(kind, location, prefix, 100)) for _ in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert reader.get("counter") == {"n": 200}
    reader.clear()


def test_key_prefix_isolation_and_clear(backend):
    _, make = backend
    a, b = make("a:"), make("b:")
    a.put("x", {"owner": "a"})
    a.put("y", {"owner": "a"})
    b.put("x", {"owner": "b"})
    assert a.get("x") == {"owner": "a"}
    assert b.get("x") == {"owner": "b"}
    assert [k for k, _ in a.scan("")] == ["x", "y"]
    assert a.clear() == 2
    assert a.scan("") == []
    assert b.get("x") == {"owner": "b"}
    assert a.clear() == 0


def test_file_store_survives_reopen_and_writes_atomically(tmp_path):
    path = tmp_path / "deep" / "state.json"
    FileStore(path, "p:").put("k", {"v": 1})
    assert FileStore(path, "p:").get("k") == {"v": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json", "state.json.lock"]


@pytest.mark.integration
def test_redis_clear_refuses_empty_prefix(redis_url):
    with pytest.raises(ValueError, match="empty key_prefix"):
        RedisStore(redis_url, "").clear()


@pytest.mark.integration
def test_create_store_from_dict_and_object(tmp_path, redis_url):
    class Persistence:
        mode = "file"
        file_path = str(tmp_path / "s.json")
        redis_url = None
        key_prefix = "srv:"

    assert isinstance(create_store(None), MemoryStore)
    assert isinstance(create_store({"mode": "memory"}), MemoryStore)
    file_store = create_store(Persistence())
    assert isinstance(file_store, FileStore) and file_store.key_prefix == "srv:"
    redis_store = create_store({"mode": "redis", "redis_url": redis_url})
    assert isinstance(redis_store, RedisStore) and redis_store.key_prefix == "twinkle:"
    unprefixed = create_store({"mode": "redis", "redis_url": redis_url, "key_prefix": ""})
    assert unprefixed.key_prefix == "twinkle:"
    with pytest.raises(ValueError, match="file_path"):
        create_store({"mode": "file"})
    with pytest.raises(ValueError, match="redis_url"):
        create_store({"mode": "redis"})
    with pytest.raises(ValueError, match="unknown persistence mode"):
        create_store({"mode": "sqlite"})


@pytest.mark.integration
def test_clear_persistence_only_touches_its_prefix(tmp_path, redis_url):
    for config in (
        {"mode": "file", "file_path": str(tmp_path / "s.json"), "key_prefix": "one:"},
        {"mode": "redis", "redis_url": redis_url, "key_prefix": "cp-one:"},
    ):
        mine = create_store(config)
        other = create_store({**config, "key_prefix": "cp-two:"})
        mine.put("a", {})
        mine.put("b", {})
        other.put("a", {})
        assert clear_persistence(config) == 2
        assert mine.scan("") == []
        assert other.get("a") == {}
        other.clear()
    assert clear_persistence({"mode": "memory"}) == 0
