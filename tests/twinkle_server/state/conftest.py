"""Fixtures of the state tests: a fake clock and the three KVStore backends."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis_fixture import redis_url  # noqa: E402, F401 - re-exported fixture

from twinkle.server.state import FileStore, MemoryStore, RedisStore  # noqa: E402

BACKENDS = ["memory", "file", pytest.param("redis", marks=pytest.mark.integration)]


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    """``make(key_prefix)``: stores of one backend that share their data (namespaces by prefix).

    Redis stores get a per-test namespace so tests never see each other's keys.
    """
    kind = request.param
    if kind == "memory":
        root = MemoryStore("")
        yield kind, root.sibling
        return
    if kind == "file":
        path = tmp_path / "state" / "state.json"
        yield kind, lambda prefix="": FileStore(path, prefix)
        return
    url = request.getfixturevalue("redis_url")
    namespace = f"test-{uuid.uuid4().hex[:8]}:"
    stores = []

    def make(prefix: str = "") -> RedisStore:
        stores.append(RedisStore(url, namespace + prefix))
        return stores[-1]

    yield kind, make
    RedisStore(url, namespace).clear()
    for store in stores:
        store.close()


@pytest.fixture
def store(backend):
    """A store of each backend, under the prefix ``app:``."""
    return backend[1]("app:")
