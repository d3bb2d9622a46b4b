"""Build the store a server config asks for, and wipe it (``twinkle-server clear persistence``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.server.state.file_store import FileStore
from twinkle.server.state.redis_store import RedisStore
from twinkle.server.state.store import KVStore, MemoryStore

PERSISTENCE_MODES = ("memory", "file", "redis")
DEFAULT_KEY_PREFIX = "twinkle:"


def persistence_option(persistence: Any, name: str, default: Any = None) -> Any:
    if isinstance(persistence, Mapping):
        value = persistence.get(name, default)
    else:
        value = getattr(persistence, name, default)
    return default if value is None else value


def create_store(persistence: Any) -> KVStore:
    """Return the :class:`KVStore` described by a persistence config.

    Args:
        persistence: A mapping or any object with the attributes ``mode`` (``memory``, ``file`` or
            ``redis``; default ``memory``), ``file_path`` (file mode), ``redis_url`` (redis mode) and
            ``key_prefix`` (default ``twinkle:``). ``None`` means memory. Redis keys are always
            namespaced: an empty ``key_prefix`` means ``twinkle:`` there, so that ``clear`` can
            never wipe a shared database.

    Raises:
        ValueError: Unknown mode, or the mode's location is missing.
    """
    if persistence is None:
        return MemoryStore(DEFAULT_KEY_PREFIX)
    mode = str(persistence_option(persistence, "mode", "memory")).lower()
    key_prefix = persistence_option(persistence, "key_prefix", DEFAULT_KEY_PREFIX)
    if mode == "memory":
        return MemoryStore(key_prefix)
    if mode == "file":
        file_path = persistence_option(persistence, "file_path")
        if not file_path:
            raise ValueError("persistence mode 'file' needs file_path")
        return FileStore(file_path, key_prefix)
    if mode == "redis":
        redis_url = persistence_option(persistence, "redis_url")
        if not redis_url:
            raise ValueError("persistence mode 'redis' needs redis_url")
        return RedisStore(redis_url, key_prefix or DEFAULT_KEY_PREFIX)
    raise ValueError(f"unknown persistence mode {mode!r}; expected one of {PERSISTENCE_MODES}")


def clear_persistence(persistence: Any) -> int:
    """Delete every key of this server's persistence (its ``key_prefix`` only); return the count.

    Memory persistence has nothing to clear outside a running server and returns 0.
    """
    store = create_store(persistence)
    try:
        return store.clear()
    finally:
        store.close()
