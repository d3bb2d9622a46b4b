"""State in Redis, shared by every replica on every machine.

Each key is one Redis string holding the JSON value, named ``key_prefix + key``. ``update`` is an
optimistic transaction (``WATCH`` / ``MULTI`` / ``EXEC``), retried when another client wrote the key in
between, so concurrent read-modify-writes from any number of processes never lose an update.
"""

from __future__ import annotations

import re
from typing import Any

from twinkle.server.state.store import KVStore, Updater, decode_value, encode_value

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
_SCAN_BATCH = 500


def _glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


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

            client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.redis_url = redis_url
        self._redis = client

    def get(self, key: str) -> dict[str, Any] | None:
        return decode_value(self._redis.get(self.key_prefix + key))

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._redis.set(self.key_prefix + key, encode_value(value))

    def delete(self, key: str) -> bool:
        return bool(self._redis.delete(self.key_prefix + key))

    def _keys(self, prefix: str) -> list[str]:
        pattern = _glob_escape(self.key_prefix + prefix) + "*"
        return sorted(set(self._redis.scan_iter(match=pattern, count=_SCAN_BATCH)))

    def scan(self, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
        keys = self._keys(prefix)
        cut, found = len(self.key_prefix), []
        for start in range(0, len(keys), _SCAN_BATCH):
            batch = keys[start : start + _SCAN_BATCH]
            for key, raw in zip(batch, self._redis.mget(batch)):
                if raw is not None:  # deleted between SCAN and MGET
                    found.append((key[cut:], decode_value(raw)))
        return found

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
