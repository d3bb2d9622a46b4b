"""The key-value interface behind all server state, and its in-process implementation.

Values are JSON objects (``dict``); bytes must be base64-encoded by the caller. Every store has a
``key_prefix``: keys are stored as ``key_prefix + key``, ``scan`` and ``get`` only see keys under it
and ``clear`` only deletes those, so several servers can share one file or one Redis database.
"""

from __future__ import annotations

import abc
import json
import threading
from collections.abc import Callable
from typing import Any

Updater = Callable[[dict[str, Any] | None], dict[str, Any] | None]


def encode_value(value: dict[str, Any]) -> str:
    """Serialize ``value`` as compact JSON, refusing anything that is not a JSON object."""
    if not isinstance(value, dict):
        raise TypeError(f"store values must be dicts, got {type(value).__name__}")
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def decode_value(raw: str | bytes | None) -> dict[str, Any] | None:
    """Parse a stored JSON object (``None`` stays ``None``)."""
    return None if raw is None else json.loads(raw)


class KVStore(abc.ABC):
    """A dict-of-dicts with an atomic read-modify-write, shared by all server processes.

    Args:
        key_prefix: Namespace of this store inside its backend.
    """

    def __init__(self, key_prefix: str = "") -> None:
        self.key_prefix = key_prefix

    @abc.abstractmethod
    def get(self, key: str) -> dict[str, Any] | None:
        """Return the value at ``key``, or ``None``."""

    @abc.abstractmethod
    def put(self, key: str, value: dict[str, Any]) -> None:
        """Store ``value`` at ``key``, replacing any previous value."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""

    @abc.abstractmethod
    def scan(self, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
        """Return ``(key, value)`` for every key starting with ``prefix``, sorted by key."""

    @abc.abstractmethod
    def update(self, key: str, fn: Updater) -> dict[str, Any] | None:
        """Atomically replace the value at ``key`` by ``fn(current)``.

        ``fn`` receives a private copy of the current value (``None`` if missing) and returns the new
        value, or ``None`` to delete the key. It may run more than once (optimistic backends retry on
        contention), so it must not have side effects. Exceptions raised by ``fn`` abort the update
        and propagate. Returns what ``fn`` returned.
        """

    @abc.abstractmethod
    def clear(self) -> int:
        """Delete every key under this store's ``key_prefix``; return how many were deleted."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or handles (no-op by default)."""


class MemoryStore(KVStore):
    """State in this process only: lost on restart, invisible to other replicas.

    Values are kept as JSON text so that callers never share mutable objects with the store and
    non-JSON values fail here exactly as they would with the file or Redis stores.
    """

    def __init__(self, key_prefix: str = "") -> None:
        super().__init__(key_prefix)
        self._data: dict[str, str] = {}
        self._lock = threading.RLock()

    def sibling(self, key_prefix: str) -> MemoryStore:
        """A store over the same memory under another prefix (two namespaces of one backend)."""
        other = MemoryStore(key_prefix)
        other._data, other._lock = self._data, self._lock
        return other

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return decode_value(self._data.get(self.key_prefix + key))

    def put(self, key: str, value: dict[str, Any]) -> None:
        raw = encode_value(value)
        with self._lock:
            self._data[self.key_prefix + key] = raw

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._data.pop(self.key_prefix + key, None) is not None

    def scan(self, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
        full, cut = self.key_prefix + prefix, len(self.key_prefix)
        with self._lock:
            hits = [(k[cut:], v) for k, v in self._data.items() if k.startswith(full)]
        return [(k, decode_value(v)) for k, v in sorted(hits)]

    def update(self, key: str, fn: Updater) -> dict[str, Any] | None:
        full = self.key_prefix + key
        with self._lock:
            new = fn(decode_value(self._data.get(full)))
            if new is None:
                self._data.pop(full, None)
            else:
                self._data[full] = encode_value(new)
            return new

    def clear(self) -> int:
        with self._lock:
            doomed = [k for k in self._data if k.startswith(self.key_prefix)]
            for k in doomed:
                del self._data[k]
            return len(doomed)
