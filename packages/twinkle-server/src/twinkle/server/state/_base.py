"""Shared plumbing of the :class:`ServerState` parts: owned reads, exclusive creates, updates."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

from twinkle.server.state.errors import BadRequestError, ConflictError, NotFoundError
from twinkle.server.state.paths import validate_id
from twinkle.server.state.store import KVStore

R = TypeVar("R", bound=BaseModel)


def new_id(prefix: str) -> str:
    """A fresh random id such as ``sess-3f2a...`` (unguessable: 128 random bits)."""
    return f"{prefix}-{uuid.uuid4().hex}"


class StateBase:
    """Owner-scoped access to typed records in a :class:`KVStore`.

    Args:
        store: Where records live.
        clock: Seconds since the epoch; injectable for tests.
    """

    def __init__(self, store: KVStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

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
