"""``persistence.mode: memory`` across Ray Serve replicas: one named actor holds the memory store.

Each deployment runs in its own process, so a plain in-process dict would give every replica its
own private state. With Ray running, memory mode instead talks to one actor (``twinkle-state`` in
the server's namespace) that every deployment finds by name. File and Redis stores are shared by
nature and are used directly.
"""

from __future__ import annotations

from typing import Any

from twinkle.server.state.factory import create_store, persistence_option
from twinkle.server.state.store import KVStore, MemoryStore, Updater

ACTOR_NAME = "twinkle-state"


class _StoreActor:
    def __init__(self, key_prefix: str) -> None:
        self.store = MemoryStore(key_prefix)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.store, method)(*args)


class RayActorStore(KVStore):
    """A :class:`KVStore` whose data lives in a named Ray actor (shared by all replicas)."""

    def __init__(self, key_prefix: str) -> None:
        import ray

        super().__init__(key_prefix)
        actor_cls = ray.remote(num_cpus=0)(_StoreActor)
        self._actor = actor_cls.options(
            name=ACTOR_NAME, get_if_exists=True, lifetime="detached"
        ).remote(key_prefix)
        self._ray = ray

    def _call(self, method: str, *args: Any) -> Any:
        return self._ray.get(self._actor.call.remote(method, *args))

    def get(self, key: str) -> dict[str, Any] | None:
        return self._call("get", key)

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._call("put", key, value)

    def delete(self, key: str) -> bool:
        return self._call("delete", key)

    def scan(self, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
        return self._call("scan", prefix)

    def update(self, key: str, fn: Updater) -> dict[str, Any] | None:
        # The actor runs fn itself: one actor call is one atomic read-modify-write.
        return self._call("update", key, fn)

    def clear(self) -> int:
        return self._call("clear")


def shared_store(persistence: Any) -> KVStore:
    """The store every deployment of one server shares."""
    import ray

    if persistence_option(persistence, "mode", "memory") == "memory" and ray.is_initialized():
        return RayActorStore(persistence_option(persistence, "key_prefix", "twinkle:"))
    return create_store(persistence)
