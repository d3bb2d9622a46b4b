"""State in Redis, shared by every replica on every machine.

Each key is one Redis string holding the JSON value, named ``key_prefix + key``. ``update`` is an
optimistic transaction (``WATCH`` / ``MULTI`` / ``EXEC``), retried when another client wrote the key in
between, so concurrent read-modify-writes from any number of processes never lose an update.

Redis down or unreachable is :class:`StoreUnavailableError` (503, retryable) naming the store by
host and port (never the URL, which may hold a password), not a generic 500. The client has socket
timeouts so that a Redis that stopped answering fails calls instead of hanging them.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from typing import Any

from twinkle.server.state.errors import StoreUnavailableError
from twinkle.server.state.store import KVStore, Updater, decode_value, encode_value

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
_SCAN_BATCH = 500
#: Seconds to connect to / wait on Redis before a call fails (503) rather than hangs.
SOCKET_TIMEOUT_S = 5.0
#: What a client is told to wait before retrying during an outage.
OUTAGE_RETRY_S = 2.0


def _glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def _guarded(method):
    """Run a store method under :meth:`RedisStore._reachable`."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._reachable():
            return method(self, *args, **kwargs)

    return call


class RedisStore(KVStore):
    """A :class:`KVStore` in the Redis database at ``redis_url``.

    Args:
        redis_url: ``redis://[:password@]host:port/db`` (``rediss://`` for TLS).
        key_prefix: Namespace of this server's keys; ``clear`` deletes only keys under it, and
            refuses to run with an empty prefix (that would wipe the whole database).
        client: An existing ``redis.Redis`` client (with ``decode_responses=True``) instead of a URL.
    """

    def __init__(
        self, redis_url: str | None = None, key_prefix: str = "twinkle:", client: Any = None
    ) -> None:
        super().__init__(key_prefix)
        if client is None:
            if not redis_url:
                raise ValueError("RedisStore needs a redis_url (e.g. redis://127.0.0.1:6379/0)")
            import redis

            client = redis.Redis.from_url(
                redis_url,
                decode_responses=True,
                socket_timeout=SOCKET_TIMEOUT_S,
                socket_connect_timeout=SOCKET_TIMEOUT_S,
            )
        self.redis_url = redis_url
        self._redis = client

    @contextlib.contextmanager
    def _reachable(self) -> Iterator[None]:
        """Turn the client's connection failures into :class:`StoreUnavailableError`."""
        import redis

        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailableError(
                f"the state store (Redis at {self._where()}) is unreachable "
                f"({type(exc).__name__}); retry later",
                retry_after=OUTAGE_RETRY_S,
            ) from exc

    def _where(self) -> str:
        kwargs = getattr(getattr(self._redis, "connection_pool", None), "connection_kwargs", {})
        if "path" in kwargs:
            return str(kwargs["path"])
        return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"

    @_guarded
    def get(self, key: str) -> dict[str, Any] | None:
        return decode_value(self._redis.get(self.key_prefix + key))

    @_guarded
    def put(self, key: str, value: dict[str, Any]) -> None:
        self._redis.set(self.key_prefix + key, encode_value(value))

    @_guarded
    def delete(self, key: str) -> bool:
        return bool(self._redis.delete(self.key_prefix + key))

    def _keys(self, prefix: str) -> list[str]:
        pattern = _glob_escape(self.key_prefix + prefix) + "*"
        return sorted(set(self._redis.scan_iter(match=pattern, count=_SCAN_BATCH)))

    @_guarded
    def scan(self, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
        keys = self._keys(prefix)
        cut, found = len(self.key_prefix), []
        for start in range(0, len(keys), _SCAN_BATCH):
            batch = keys[start : start + _SCAN_BATCH]
            for key, raw in zip(batch, self._redis.mget(batch)):
                if raw is not None:  # deleted between SCAN and MGET
                    found.append((key[cut:], decode_value(raw)))
        return found

    @_guarded
    def update(self, key: str, fn: Updater) -> dict[str, Any] | None:
        import redis

        full = self.key_prefix + key
        with self._redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(full)
                    new = fn(decode_value(pipe.get(full)))
                    pipe.multi()
                    if new is None:
                        pipe.delete(full)
                    else:
                        pipe.set(full, encode_value(new))
                    pipe.execute()
                    return new
                except redis.WatchError:
                    continue
                finally:
                    pipe.reset()

    @_guarded
    def clear(self) -> int:
        if not self.key_prefix:
            raise ValueError("refusing to clear a RedisStore with an empty key_prefix")
        keys = self._keys("")
        deleted = 0
        for start in range(0, len(keys), _SCAN_BATCH):
            deleted += self._redis.delete(*keys[start : start + _SCAN_BATCH])
        return deleted

    def close(self) -> None:
        self._redis.close()
