"""Shared plumbing of the :class:`ServerState` parts: owned reads, exclusive creates, updates."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from twinkle.server.state.errors import BadRequestError, ConflictError, NotFoundError
from twinkle.server.state.paths import validate_id
from twinkle.server.state.store import KVStore

R = TypeVar("R", bound=BaseModel)


def new_id(prefix: str) -> str:
    """A fresh random id such as ``sess-3f2a...`` (unguessable: 128 random bits)."""
    return f"{prefix}-{uuid.uuid4().hex}"


KiB, MiB, DAY_S = 1024, 1024 * 1024, 86400.0


@dataclass(frozen=True)
class StateLimits:
    """How much one tenant may keep in the shared state (the gateway's ``server`` args).

    Args:
        max_metadata_bytes: JSON size of one session's ``user_metadata`` and ``tags`` together,
            or of one training run's ``user_metadata``; over it a 413.
        max_tenant_metadata_bytes: What all of one tenant's kept sessions and runs hold together;
            over it (after dropping the tenant's oldest finished sessions to make room) a 403.
        keep_finished_sessions: Finished sessions kept per tenant; older ones are compacted.
        finished_session_ttl_s: Seconds a finished session is kept after its last heartbeat
            (``None``: until ``keep_finished_sessions`` pushes it out).
    """

    max_metadata_bytes: int = 64 * KiB
    max_tenant_metadata_bytes: int = 1 * MiB
    keep_finished_sessions: int = 100
    finished_session_ttl_s: float | None = 7 * DAY_S

    @classmethod
    def of(cls, args: Any) -> StateLimits:
        """The limits a ``ServerArgs`` (or any object with these attributes) sets."""
        default = cls()
        return cls(
            **{
                name: getattr(args, name, getattr(default, name))
                for name in cls.__dataclass_fields__
            }
        )


class StateBase:
    """Owner-scoped access to typed records in a :class:`KVStore`.

    Args:
        store: Where records live.
        clock: Seconds since the epoch; injectable for tests.
        limits: What one tenant may keep (default: :class:`StateLimits`' defaults).
    """

    def __init__(
        self,
        store: KVStore,
        clock: Callable[[], float] = time.time,
        limits: StateLimits | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.limits = limits or StateLimits()

    @staticmethod
    def _text_id(value: Any, field: str) -> str:
        """``value`` when it is a string; a 400 naming ``field`` otherwise (a JSON number, list
        or boolean where an id belongs must not reach the key's concatenation as a 500)."""
        if not isinstance(value, str):
            raise BadRequestError(f"{field} must be a string, got {type(value).__name__}")
        return value

    def _load(self, key: str, model: type[R], owner: str, what: str) -> R:
        """The record at ``key`` if ``owner`` owns it; another owner's record is "not found"."""
        raw = self.store.get(key)
        if raw is None or raw.get("owner") != owner:
            raise NotFoundError(f"{what} not found")
        return model.model_validate(raw)

    def _create(self, key: str, record: BaseModel, what: str) -> None:
        """Store a new record; never overwrite an existing one, whoever owns it."""
        value = record.model_dump(mode="json")

        def create(current: dict[str, Any] | None) -> dict[str, Any]:
            if current is not None:
                raise ConflictError(f"{what} already exists")
            return value

        self.store.update(key, create)

    def _modify(
        self, key: str, model: type[R], owner: str, what: str, change: Callable[[R], R | None]
    ) -> R:
        """Atomically apply ``change`` to ``owner``'s record (``None`` from ``change`` keeps it).

        The result is read from ``update``'s return value, not from a side effect of ``apply``:
        a store may run ``apply`` in another process (the Ray actor behind memory mode).
        """

        def apply(current: dict[str, Any] | None) -> dict[str, Any]:
            if current is None or current.get("owner") != owner:
                raise NotFoundError(f"{what} not found")
            record = model.model_validate(current)
            changed = change(record) or record
            return changed.model_dump(mode="json")

        return model.model_validate(self.store.update(key, apply))

    def _all(self, prefix: str, model: type[R], owner: str | None = None) -> list[R]:
        """Every record under ``prefix`` (``owner``'s only when given)."""
        return [
            model.model_validate(raw)
            for _, raw in self.store.scan(prefix)
            if owner is None or raw.get("owner") == owner
        ]

    @staticmethod
    def _owner(owner: str) -> str:
        return validate_id(owner, "owner")
