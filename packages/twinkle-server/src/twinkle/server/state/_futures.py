"""Futures of :class:`ServerState`: the results ``retrieve_future`` hands back."""

from __future__ import annotations

from typing import Any

from twinkle.server.state._base import StateBase, new_id
from twinkle.server.state.errors import ConflictError
from twinkle.server.state.paths import validate_id
from twinkle.server.state.records import FutureError, FutureRecord

FUTURE = "future/"


class FuturesMixin(StateBase):
    """Pending, finished and failed requests, each visible to its owner only."""

    def create_future(
        self, owner: str, kind: str, model_id: str | None = None, request_id: str | None = None
    ) -> FutureRecord:
        """Register a pending request (``kind`` is the route, e.g. ``forward_backward``)."""
        record = FutureRecord(
            request_id=validate_id(request_id or new_id("req"), "request id"),
            owner=self._owner(owner),
            model_id=model_id,
            kind=kind,
            created_at=self.clock(),
        )
        self._create(FUTURE + record.request_id, record, "future")
        return record

    def get_future(self, owner: str, request_id: str) -> FutureRecord:
        """``owner``'s future, or :class:`NotFoundError`."""
        return self._load(FUTURE + request_id, FutureRecord, owner, "future")

    def _finish(self, owner: str, request_id: str, **fields: Any) -> FutureRecord:
        finished_at = self.clock()  # read here: the update may run in the store's process

        def finish(record: FutureRecord) -> FutureRecord:
            if record.status != "pending":
                raise ConflictError(f"future {request_id} is already {record.status}")
            return FutureRecord.model_validate(
                {**record.model_dump(), **fields, "finished_at": finished_at}
            )

        return self._modify(FUTURE + request_id, FutureRecord, owner, "future", finish)

    def complete_future(
        self,
        owner: str,
        request_id: str,
        result: Any = None,
        result_b64: str | None = None,
        content_type: str = "application/json",
    ) -> FutureRecord:
        """Store the result: JSON in ``result``, or protobuf bytes base64-encoded in ``result_b64``."""
        return self._finish(
            owner,
            request_id,
            status="done",
            result=result,
            result_b64=result_b64,
            content_type=content_type,
        )

    def fail_future(
        self, owner: str, request_id: str, message: str, category: str = "server"
    ) -> FutureRecord:
        """Store a failure; ``category`` is ``user``, ``server`` or ``unknown`` (Tinker's)."""
        error = FutureError(category=category, message=message)
        return self._finish(owner, request_id, status="error", error=error.model_dump())

    def set_queue_state(self, owner: str, request_id: str, queue_state: str) -> FutureRecord:
        """Report why a pending request waits: ``active``, ``paused_rate_limit``, ``paused_capacity``."""
        return self._modify(
            FUTURE + request_id,
            FutureRecord,
            owner,
            "future",
            lambda r: FutureRecord.model_validate({**r.model_dump(), "queue_state": queue_state}),
        )

    def count_active_futures(self, owner: str | None = None, model_id: str | None = None) -> int:
        """Pending futures, of one owner and/or model when given (rate limits, metrics)."""
        return sum(
            1
            for f in self._all(FUTURE, FutureRecord, owner)
            if f.status == "pending" and (model_id is None or f.model_id == model_id)
        )

    def purge_futures(self, older_than: float) -> int:
        """Delete finished futures that finished more than ``older_than`` seconds ago."""
        cutoff = self.clock() - older_than
        purged = 0
        for record in self._all(FUTURE, FutureRecord):
            if record.finished_at is not None and record.finished_at < cutoff:
                purged += self.store.delete(FUTURE + record.request_id)
        return purged
