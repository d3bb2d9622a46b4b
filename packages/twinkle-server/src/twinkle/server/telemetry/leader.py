"""The cleanup leader: one worker among all replicas holds a lease in the shared state store.

Only the leader publishes the server-wide resource gauges (sessions, models, futures), so a
dashboard sums no duplicates however many replicas run. The lease is renewed on every use and
expires after ``ttl_s``: when the leader dies, another worker takes over at its next renewal.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("twinkle.server.telemetry")

LEADER_KEY = "telemetry:leader"


def worker_id() -> str:
    """``host:pid:random`` -- unique per process, readable in logs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaderLease:
    """A renewable lease at ``key`` in a :class:`~twinkle.server.state.KVStore`.

    Args:
        store: The store every worker shares (memory, file or Redis).
        ttl_s: Seconds a lease lasts without renewal.
        holder: This worker's id (default: :func:`worker_id`).
        key: Store key of the lease.
        clock: Seconds since the epoch; injectable for tests.
    """

    def __init__(
        self,
        store: Any,
        ttl_s: float,
        holder: str | None = None,
        key: str = LEADER_KEY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.ttl_s, self.key, self.clock = store, ttl_s, key, clock
        self.holder = holder or worker_id()
        self.held = False

    def renew(self) -> bool:
        """Take or extend the lease if it is free, expired or ours; returns whether we hold it."""
        now = self.clock()
        mine = {"holder": self.holder, "expires_at": now + self.ttl_s}

        def take(current: dict[str, Any] | None) -> dict[str, Any]:
            if (
                current is None
                or current.get("holder") == self.holder
                or current.get("expires_at", 0) <= now
            ):
                return mine
            return current

        try:
            value = self.store.update(self.key, take)
        except Exception:  # the store is down: publish nothing rather than duplicates
            logger.warning("cannot renew the cleanup leader lease", exc_info=True)
            value = None
        held = bool(value) and value.get("holder") == self.holder
        if held and not self.held:
            logger.info("became cleanup leader (worker %s)", self.holder)
        elif self.held and not held:
            logger.info("no longer cleanup leader (worker %s)", self.holder)
        self.held = held
        return held

    def release(self) -> None:
        """Give the lease up now (on shutdown) so another worker need not wait for expiry."""

        def drop(current: dict[str, Any] | None) -> dict[str, Any] | None:
            return None if current and current.get("holder") == self.holder else current

        self.store.update(self.key, drop)
        self.held = False
