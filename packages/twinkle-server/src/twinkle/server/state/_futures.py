"""Futures of :class:`ServerState`: the results ``retrieve_future`` hands back.

A future runs as a task of one gateway process (an *instance*). Each instance keeps a lease
(``instance/<id>``: host, pid, process start time, last renewal); a pending future whose instance
is gone (its process died on this host, or its lease expired) will never finish, and is failed
with an error that says so instead of being polled forever.

Submissions are remembered in the state too (``dedupe/<owner>/<digest>`` -> request id), so a
resubmission that reaches another gateway replica, or this one after a restart, answers the first
submission's future instead of running the call again. A first submission that can no longer finish
(its process died before it completed) does not count: the resubmission runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from typing import Any

from twinkle.server.state._base import StateBase, new_id
from twinkle.server.state.errors import ConflictError, NotFoundError
from twinkle.server.state.paths import validate_id
from twinkle.server.state.records import FutureError, FutureRecord

FUTURE = "future/"
INSTANCE = "instance/"
DEDUPE = "dedupe/"
LEASE_TTL_S = 30.0
#: Calls that change nothing on the model (``kind`` of their future): an orphaned one may run
#: again. Any other call may have run on its model replica after the gateway running its future
#: died (a Serve call is not cancelled with its caller), so running it again could apply it twice.
RERUNNABLE_KINDS = frozenset({"sample", "forward_only"})
ORPHANED = (
    "the server process running this request stopped (restarted or killed) before it finished; "
    "it did not complete here: resubmit it"
)
ORPHANED_STATEFUL = (
    "the server process running this request stopped (restarted or killed) before its outcome "
    "was recorded; the model may have run it, so resubmitting it could run it twice: reload the "
    "model from its newest checkpoint"
)
UNRECORDED = (
    "this request's outcome could not be recorded ({why}): it may have run, so resubmitting it "
    "could run it twice; reload the model from its newest checkpoint instead"
)


def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live process from a reused pid), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class FuturesMixin(StateBase):
    """Pending, finished and failed requests, each visible to its owner only."""

    def create_future(
        self,
        owner: str,
        kind: str,
        model_id: str | None = None,
        request_id: str | None = None,
        instance: str | None = None,
    ) -> FutureRecord:
        """Register a pending request (``kind`` is the route, e.g. ``forward_backward``) run by
        the gateway process ``instance`` (see :meth:`renew_instance`)."""
        record = FutureRecord(
            request_id=validate_id(request_id or new_id("req"), "request id"),
            owner=self._owner(owner),
            model_id=model_id,
            kind=kind,
            created_at=self.clock(),
            instance=instance,
        )
        self._create(FUTURE + record.request_id, record, "future")
        return record

    def get_future(self, owner: str, request_id: str) -> FutureRecord:
        """``owner``'s future, or :class:`NotFoundError`."""
        return self._load(
            FUTURE + self._text_id(request_id, "request_id"), FutureRecord, owner, "future"
        )

    def _finish(self, owner: str, request_id: str, **fields: Any) -> FutureRecord:
        finished_at = self.clock()  # read here: the update may run in the store's process

        def finish(record: FutureRecord) -> FutureRecord:
            if record.status != "pending":
                raise ConflictError(f"future {request_id} is already {record.status}")
            return FutureRecord.model_validate(
                {**record.model_dump(), **fields, "finished_at": finished_at}
            )

        return self._modify(
            FUTURE + self._text_id(request_id, "request_id"), FutureRecord, owner, "future", finish
        )

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

    # -- instances ------------------------------------------------------------------------------
    def renew_instance(self, instance: str) -> None:
        """Write (or renew) the lease of this process as gateway ``instance``."""
        pid = os.getpid()
        self.store.put(
            INSTANCE + validate_id(instance, "instance id"),
            {
                "host": socket.gethostname(),
                "pid": pid,
                "start": _process_start(pid),
                "renewed_at": self.clock(),
            },
        )

    def instance_alive(self, instance: str | None, ttl_s: float = LEASE_TTL_S) -> bool:
        """Whether gateway ``instance`` may still finish its futures: on this host, its process
        is running; elsewhere, its lease was renewed within ``ttl_s``."""
        lease = self.store.get(INSTANCE + instance) if instance else None
        if lease is None:
            return False
        if lease.get("host") == socket.gethostname() and lease.get("start") is not None:
            return _process_start(int(lease["pid"])) == lease["start"]
        return self.clock() - float(lease.get("renewed_at", 0.0)) <= ttl_s

    def fail_orphaned_future(
        self, owner: str, request_id: str, message: str | None = None
    ) -> FutureRecord:
        """Fail a pending future whose task is gone (a finished one is returned as is), by
        default saying whether it may be resubmitted (:data:`RERUNNABLE_KINDS`) or not."""
        if message is None:
            kind = self.get_future(owner, request_id).kind
            message = ORPHANED if kind in RERUNNABLE_KINDS else ORPHANED_STATEFUL
        try:
            return self.fail_future(owner, request_id, message, category="server")
        except ConflictError:  # it finished after all (a late write of its instance)
            return self.get_future(owner, request_id)

    # -- resubmissions ---------------------------------------------------------------------------
    def _dedupe_key(self, owner: str, key: tuple) -> str:
        digest = hashlib.sha256(json.dumps(list(key), default=str).encode()).hexdigest()[:40]
        return f"{DEDUPE}{self._owner(owner)}/{digest}"

    def remember_submission(self, owner: str, key: tuple, request_id: str) -> None:
        """Record that ``owner``'s call identified by ``key`` runs as future ``request_id``."""
        self.store.put(self._dedupe_key(owner, key), {"request_id": request_id, "at": self.clock()})

    def find_submission(self, owner: str, key: tuple) -> str | None:
        """The future of an earlier submission of ``key`` that is done, failed, or still running
        in a live process; ``None`` when there is none, or when it was a call that changes nothing
        (:data:`RERUNNABLE_KINDS`) orphaned by its process's death: then the resubmission runs. An
        orphaned training call answers its failure instead (it may have run on the model)."""
        raw = self.store.get(self._dedupe_key(owner, key))
        if raw is None:
            return None
        try:
            record = self.get_future(owner, str(raw.get("request_id")))
        except NotFoundError:  # purged
            return None
        if record.status == "pending" and not self.instance_alive(record.instance):
            record = self.fail_orphaned_future(owner, record.request_id)
        orphaned = record.status == "error" and record.error is not None
        orphaned = orphaned and record.error.message == ORPHANED
        return None if orphaned else record.request_id

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
        for key, value in self.store.scan(DEDUPE):
            if float(value.get("at", 0.0)) < cutoff:
                self.store.delete(key)
        return purged
