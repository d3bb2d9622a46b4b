"""Audit events and usage counters of :class:`ServerState` (read by the Tinker admin calls).

- Audit events are rare (checkpoints, sessions, projects): each one is written when it happens,
  by the state method that does it (this mixin wraps them), so every deployment records them.
- Usage (tokens trained, prompt tokens and sampled tokens) comes from the hot path: it is summed in
  memory per (owner, UTC hour, kind, base model, session) and added to the store at most every
  :data:`FLUSH_S` seconds, and whenever it is read. A crash loses at most that window's counts.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from twinkle.server.state._base import StateBase
from twinkle.server.state._sessions import SESSION_INFO, check_name
from twinkle.server.state.records import CheckpointRecord, SamplingSessionRecord, SessionRecord

AUDIT, USAGE = "audit/", "usage/"
#: Longest finish detail a session keeps (a client's traceback is cut, not refused).
MAX_DETAIL_CHARS = 4096
FLUSH_S = 5.0
HOUR_S = 3600
_EVENT_SEQ = itertools.count()
UsageKind = Literal["training", "sampling_prefill", "sampling_sample"]


class AuditEventRecord(BaseModel):
    """One audit event (``<resource>_<action>``), visible to the owner who caused it."""

    model_config = ConfigDict(extra="ignore")

    owner: str
    timestamp: float
    event: str
    event_details: dict[str, Any] = Field(default_factory=dict)


class UsageBucketRecord(BaseModel):
    """Tokens of one kind in one UTC hour, for one owner, base model and session."""

    model_config = ConfigDict(extra="ignore")

    owner: str
    bucket_start: int
    kind: UsageKind
    base_model: str | None = None
    session_id: str | None = None
    token_count: int = 0


class SessionInfoRecord(BaseModel):
    """What a session's client says about it beyond :class:`SessionRecord` (Tinker's project,
    display name and finish reason); kept apart so that session records stay as they are."""

    model_config = ConfigDict(extra="ignore")

    owner: str
    session_id: str
    project_id: str | None = None
    display_name: str | None = None
    finish_reason: str | None = None  # the client's ``success``, ``errored`` or ``interrupted``
    finish_detail: str | None = None


_BucketKey = tuple[str, int, str, str, str]


class ActivityMixin(StateBase):
    """Audit log and usage counters; placed first in :class:`ServerState`'s bases."""

    # -- audit ----------------------------------------------------------------------------------
    def record_event(self, owner: str, event: str, **details: Any) -> AuditEventRecord:
        """Append an audit event of ``owner`` (details: ids and paths, never secrets)."""
        now = self.clock()
        record = AuditEventRecord(owner=owner, timestamp=now, event=event, event_details=details)
        # Time, then this process's sequence (events of one instant keep their order), then a
        # random part (replicas never collide).
        seq = next(_EVENT_SEQ)
        key = f"{AUDIT}{owner}/{int(now * 1e6):020d}-{seq:012d}-{uuid.uuid4().hex[:8]}"
        self.store.put(key, record.model_dump(mode="json"))
        return record

    def list_events(
        self, owner: str, start: float | None = None, end: float | None = None
    ) -> list[AuditEventRecord]:
        """``owner``'s events with ``start <= timestamp < end``, oldest first."""
        found = [
            AuditEventRecord.model_validate(raw)
            for _, raw in sorted(self.store.scan(f"{AUDIT}{owner}/"), key=lambda kv: kv[0])
            if raw.get("owner") == owner
        ]
        found = [
            e
            for e in found
            if (start is None or e.timestamp >= start) and (end is None or e.timestamp < end)
        ]
        return found

    # -- the audited operations -----------------------------------------------------------------
    def create_session(self, owner: str, *args: Any, **kwargs: Any) -> SessionRecord:
        info = {k: kwargs.pop(k) for k in ("project_id", "display_name") if k in kwargs}
        for field, value in info.items():
            check_name(value, field)
        record = super().create_session(owner, *args, **kwargs)  # type: ignore[misc]
        if any(v is not None for v in info.values()):
            self.update_session_info(owner, record.session_id, **info)
        self.record_event(owner, "session_create", session_id=record.session_id, **info)
        return record

    def finish_session(
        self, owner: str, session_id: str, reason: str | None = None, detail: str | None = None
    ) -> SessionRecord:
        check_name(reason, "reason")
        already = self.get_session(owner, session_id).finished  # type: ignore[attr-defined]
        record = super().finish_session(owner, session_id)  # type: ignore[misc]
        if not already:
            if isinstance(detail, str):
                detail = detail[:MAX_DETAIL_CHARS]
            self.update_session_info(owner, session_id, finish_reason=reason, finish_detail=detail)
            self.record_event(owner, "session_finish", session_id=session_id, reason=reason)
        return record

    def session_info(self, owner: str, session_id: str) -> SessionInfoRecord:
        """The descriptive fields of ``owner``'s session (defaults when it has none)."""
        raw = self.store.get(SESSION_INFO + session_id)
        if raw is None or raw.get("owner") != owner:
            return SessionInfoRecord(owner=owner, session_id=session_id)
        return SessionInfoRecord.model_validate(raw)

    def update_session_info(self, owner: str, session_id: str, **fields: Any) -> SessionInfoRecord:
        """Change the project, display name or finish reason of ``owner``'s session."""
        for field in ("project_id", "display_name"):
            check_name(fields.get(field), field)
        self.get_session(owner, session_id)  # type: ignore[attr-defined]  # NotFound for others

        def change(current: dict[str, Any] | None) -> dict[str, Any]:
            base = current or {"owner": owner, "session_id": session_id}
            return SessionInfoRecord.model_validate({**base, **fields}).model_dump(mode="json")

        return SessionInfoRecord.model_validate(
            self.store.update(SESSION_INFO + session_id, change)
        )

    def assign_session_project(
        self, owner: str, session_id: str, project_id: str
    ) -> SessionInfoRecord:
        """Move ``owner``'s session into ``project_id`` (audited)."""
        info = self.update_session_info(owner, session_id, project_id=project_id)
        self.record_event(
            owner, "project_session_assign", session_id=session_id, project_id=project_id
        )
        return info

    def add_checkpoint(self, owner: str, run_id: str, kind: str, name: str, *args, **kwargs):
        record, evicted = super().add_checkpoint(  # type: ignore[misc]
            owner, run_id, kind, name, *args, **kwargs
        )
        self._checkpoint_event(owner, "checkpoint_create", record)
        for old in evicted:
            self._checkpoint_event(owner, "checkpoint_delete", old, reason="retention")
        return record, evicted

    def delete_checkpoint(self, owner: str, run_id: str, checkpoint_id: str) -> CheckpointRecord:
        record = super().delete_checkpoint(owner, run_id, checkpoint_id)  # type: ignore[misc]
        self._checkpoint_event(owner, "checkpoint_delete", record)
        return record

    def set_checkpoint_public(
        self, owner: str, run_id: str, checkpoint_id: str, public: bool
    ) -> CheckpointRecord:
        record = super().set_checkpoint_public(  # type: ignore[misc]
            owner, run_id, checkpoint_id, public
        )
        event = "checkpoint_publish" if public else "checkpoint_unpublish"
        self._checkpoint_event(owner, event, record)
        return record

    def set_checkpoint_ttl(
        self, owner: str, run_id: str, checkpoint_id: str, ttl_seconds: float | None
    ) -> CheckpointRecord:
        record = super().set_checkpoint_ttl(  # type: ignore[misc]
            owner, run_id, checkpoint_id, ttl_seconds
        )
        self._checkpoint_event(owner, "checkpoint_ttl_set", record, ttl_seconds=ttl_seconds)
        return record

    def _checkpoint_event(self, owner: str, event: str, ckpt: CheckpointRecord, **more) -> None:
        self.record_event(
            owner,
            event,
            model_id=ckpt.training_run_id,
            tinker_path=ckpt.tinker_path,
            checkpoint_id=ckpt.checkpoint_id,
            **more,
        )

    # -- usage ----------------------------------------------------------------------------------
    def count_usage(
        self,
        owner: str,
        kind: UsageKind,
        tokens: int,
        base_model: str | None = None,
        session_id: str | None = None,
    ) -> None:
        """Add ``tokens`` to this hour's counter in memory (cheap: no store call but every
        :data:`FLUSH_S` seconds)."""
        if tokens <= 0:
            return
        now = self.clock()
        key = (owner, int(now // HOUR_S) * HOUR_S, kind, base_model or "", session_id or "")
        lock, pending = self._usage_buffer()
        with lock:
            pending[key] = pending.get(key, 0) + int(tokens)
            due = now - self.__dict__.get("_usage_flushed_at", 0.0) >= FLUSH_S
        if due:
            self.flush_usage()

    def flush_usage(self) -> int:
        """Add the counts kept in memory to the store; returns how many buckets it wrote."""
        lock, pending = self._usage_buffer()
        with lock:
            taken = dict(pending)
            pending.clear()
            self.__dict__["_usage_flushed_at"] = self.clock()
        for key, tokens in taken.items():
            try:
                self._add_to_bucket(key, tokens)
            except Exception:
                with lock:  # keep them for the next flush
                    pending[key] = pending.get(key, 0) + tokens
                raise
        return len(taken)

    def usage_buckets(
        self, owner: str, start: float | None = None, end: float | None = None
    ) -> list[UsageBucketRecord]:
        """``owner``'s hourly buckets starting in ``[start, end)``, oldest first."""
        self.flush_usage()
        found = [
            UsageBucketRecord.model_validate(raw)
            for _, raw in self.store.scan(f"{USAGE}{owner}/")
            if raw.get("owner") == owner
        ]
        found = [
            b
            for b in found
            if (start is None or b.bucket_start >= start) and (end is None or b.bucket_start < end)
        ]
        return sorted(found, key=lambda b: (b.bucket_start, -b.token_count))

    def checkpoints_of(self, owner: str) -> list[CheckpointRecord]:
        """Every unexpired checkpoint of ``owner`` (all runs), newest first."""
        now = self.clock()
        found = [c for c in self._all("ckpt/", CheckpointRecord, owner) if not c.is_expired(now)]
        return sorted(found, key=lambda c: (c.time, c.checkpoint_id), reverse=True)

    def sampling_sessions_of(self, owner: str) -> list[SamplingSessionRecord]:
        """Every sampling session of ``owner``, oldest first."""
        found = self._all("sampling/", SamplingSessionRecord, owner)
        return sorted(found, key=lambda r: (r.created_at, r.sampling_session_id))

    def __getstate__(self) -> dict[str, Any]:
        # Update functions sent to a shared store (the Ray store actor) can capture this object;
        # the usage buffer (a lock and counts not yet flushed) belongs to this process only.
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_usage_")}

    def _usage_buffer(self) -> tuple[threading.Lock, dict[_BucketKey, int]]:
        if "_usage_lock" not in self.__dict__:
            self.__dict__.setdefault("_usage_lock", threading.Lock())
            self.__dict__.setdefault("_usage_pending", {})
        return self.__dict__["_usage_lock"], self.__dict__["_usage_pending"]

    def _add_to_bucket(self, key: _BucketKey, tokens: int) -> None:
        owner, hour, kind, base_model, session_id = key
        digest = hashlib.sha256(f"{kind}|{base_model}|{session_id}".encode()).hexdigest()[:16]

        def add(current: dict[str, Any] | None) -> dict[str, Any]:
            if current is None:
                current = UsageBucketRecord(
                    owner=owner,
                    bucket_start=hour,
                    kind=kind,  # type: ignore[arg-type]
                    base_model=base_model or None,
                    session_id=session_id or None,
                ).model_dump(mode="json")
            return {**current, "token_count": int(current.get("token_count", 0)) + tokens}

        self.store.update(f"{USAGE}{owner}/{hour:012d}/{digest}", add)
