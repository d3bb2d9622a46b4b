"""Sessions, training runs and sampling sessions of :class:`ServerState`.

What a tenant stores is bounded (:class:`~twinkle.server.state._base.StateLimits`): each session's
``user_metadata`` and ``tags`` and each run's ``user_metadata`` have a size cap, and one ledger per
tenant (``quota/<owner>``, changed atomically) holds the size of every such record, so the tenant's
total holds under any interleaving. Finished sessions are compacted (their records deleted, their
runs' metadata dropped, their bytes given back) past ``keep_finished_sessions`` or their TTL, and
to make room when the tenant's total is reached.
"""

from __future__ import annotations

import json
from typing import Any

from twinkle.server.state._base import StateBase, new_id
from twinkle.server.state.errors import BadRequestError, ConflictError, ForbiddenError, GoneError
from twinkle.server.state.paths import validate_id
from twinkle.server.state.records import SamplingSessionRecord, SessionRecord, TrainingRunRecord
from twinkle.server.web.errors import PayloadTooLarge

SESSION, RUN, SAMPLING, QUOTA = "session/", "run/", "sampling/", "quota/"
SESSION_INFO = "session_info/"
_FROZEN_RUN_FIELDS = frozenset(
    {"training_run_id", "owner", "session_id", "created_at", "user_metadata"}
)
#: A ledger entry whose record is missing is dropped only this long after it was written (its
#: record may be about to be created).
STALE_ENTRY_S = 60.0
#: Longest ``sdk_version``, ``project_id`` or ``display_name`` a session keeps.
MAX_NAME_CHARS = 1024


def json_size(value: Any) -> int:
    """Bytes ``value`` takes in the store (compact JSON; empty values take none)."""
    return len(json.dumps(value, separators=(",", ":"))) if value else 0


class OverQuotaError(ForbiddenError):
    """The tenant's stored metadata would pass ``max_tenant_metadata_bytes``."""


def _ledger_add(owner: str, key: str, size: int, now: float, limit: int):
    def add(current: dict[str, Any] | None) -> dict[str, Any]:
        records = dict((current or {}).get("records", {}))
        used = sum(entry[0] for k, entry in records.items() if k != key)
        if used + size > limit:
            raise OverQuotaError(
                f"this tenant's sessions and runs store {used} bytes of user_metadata and tags; "
                f"{size} more would pass max_tenant_metadata_bytes={limit}: finish sessions "
                "or store less"
            )
        records[key] = [size, now]
        return {"owner": owner, "records": records}

    return add


def _ledger_drop(keys: list[str]):
    def drop(current: dict[str, Any] | None) -> dict[str, Any] | None:
        if current is None:
            return None
        records = {k: v for k, v in current.get("records", {}).items() if k not in keys}
        return {**current, "records": records} if records else None

    return drop


class SessionsMixin(StateBase):
    """Client sessions, training runs (models) and sampling sessions, each scoped to its owner."""

    # -- sessions -------------------------------------------------------------------------------
    def create_session(
        self,
        owner: str,
        tags: list[str] | None = None,
        user_metadata: dict[str, Any] | None = None,
        sdk_version: str | None = None,
        session_id: str | None = None,
    ) -> SessionRecord:
        """Open a session for ``owner`` (a fresh random id unless ``session_id`` is given).

        Raises:
            PayloadTooLarge: ``user_metadata`` and ``tags`` over ``max_metadata_bytes`` (413).
            OverQuotaError: The tenant's total would pass ``max_tenant_metadata_bytes`` (403).
        """
        now = self.clock()
        tags, user_metadata = list(tags or []), dict(user_metadata or {})
        check_name(sdk_version, "sdk_version")
        size = self._capped(json_size(user_metadata) + json_size(tags), "a session", "and tags")
        record = SessionRecord(
            session_id=validate_id(session_id or new_id("sess"), "session id"),
            owner=self._owner(owner),
            created_at=now,
            last_heartbeat=now,
            tags=tags,
            user_metadata=user_metadata,
            sdk_version=sdk_version,
        )
        self._create_counted(SESSION + record.session_id, record, "session", size)
        return record

    def get_session(self, owner: str, session_id: str) -> SessionRecord:
        """``owner``'s session, or :class:`NotFoundError`."""
        return self._load(
            SESSION + self._text_id(session_id, "session_id"), SessionRecord, owner, "session"
        )

    def heartbeat(self, owner: str, session_id: str) -> SessionRecord:
        """Record a heartbeat; a finished session raises :class:`GoneError` (HTTP 410)."""

        def beat(record: SessionRecord) -> SessionRecord:
            if record.finished:
                raise GoneError("session is finished")
            return record.model_copy(update={"last_heartbeat": self.clock()})

        return self._modify(
            SESSION + self._text_id(session_id, "session_id"), SessionRecord, owner, "session", beat
        )

    def finish_session(self, owner: str, session_id: str) -> SessionRecord:
        """Mark the session finished (idempotent); compact ``owner``'s finished sessions past
        ``keep_finished_sessions`` or their TTL (never this one)."""
        record = self._modify(
            SESSION + self._text_id(session_id, "session_id"),
            SessionRecord,
            owner,
            "session",
            lambda r: r.model_copy(update={"finished": True}),
        )
        self.compact_sessions(owner, spare=session_id)
        return record

    def list_sessions(self, owner: str, include_finished: bool = False) -> list[SessionRecord]:
        """``owner``'s sessions, oldest first."""
        found = self._all(SESSION, SessionRecord, owner)
        found = [s for s in found if include_finished or not s.finished]
        return sorted(found, key=lambda s: s.created_at)

    def expired_sessions(self, timeout: float) -> list[SessionRecord]:
        """Unfinished sessions of every owner without a heartbeat for more than ``timeout`` s."""
        deadline = self.clock() - timeout
        return [
            s
            for s in self._all(SESSION, SessionRecord)
            if not s.finished and s.last_heartbeat < deadline
        ]

    # -- training runs --------------------------------------------------------------------------
    def create_run(
        self,
        owner: str,
        session_id: str,
        base_model: str,
        lora_rank: int,
        model_seq_id: int = 0,
        lora_config: dict[str, Any] | None = None,
        user_metadata: dict[str, Any] | None = None,
        training_run_id: str | None = None,
        adapter_name: str | None = None,
    ) -> TrainingRunRecord:
        """Register a training run in ``owner``'s live session.

        The id defaults to ``<session_id>:train:<model_seq_id>``, which is what the Tinker SDK
        assumes for runs created from a checkpoint.
        """
        if self.get_session(owner, session_id).finished:
            raise ConflictError("session is finished")
        user_metadata = dict(user_metadata or {})
        size = self._capped(json_size(user_metadata), "a training run", "")
        now = self.clock()
        run_id = training_run_id or f"{session_id}:train:{model_seq_id}"
        record = TrainingRunRecord(
            training_run_id=validate_id(run_id, "training run id"),
            owner=owner,
            session_id=session_id,
            base_model=base_model,
            model_seq_id=model_seq_id,
            lora_rank=lora_rank,
            lora_config=dict(lora_config or {}),
            created_at=now,
            last_request_time=now,
            user_metadata=user_metadata,
            adapter_name=adapter_name,
        )
        self._create_counted(RUN + record.training_run_id, record, "training run", size)
        return record

    def get_run(self, owner: str, run_id: str) -> TrainingRunRecord:
        """``owner``'s training run, or :class:`NotFoundError`."""
        return self._load(
            RUN + self._text_id(run_id, "run_id"), TrainingRunRecord, owner, "training run"
        )

    def list_runs(
        self, owner: str, limit: int = 20, offset: int = 0
    ) -> tuple[list[TrainingRunRecord], int]:
        """A page of ``owner``'s runs, newest first, and the total count."""
        runs = sorted(
            self._all(RUN, TrainingRunRecord, owner),
            key=lambda r: (r.created_at, r.training_run_id),
            reverse=True,
        )
        return runs[max(offset, 0) : max(offset, 0) + max(limit, 0)], len(runs)

    def touch_run(self, owner: str, run_id: str) -> TrainingRunRecord:
        """Set the run's ``last_request_time`` to now."""
        return self.update_run(owner, run_id, last_request_time=self.clock())

    def update_run(self, owner: str, run_id: str, /, **fields: Any) -> TrainingRunRecord:
        """Change fields of ``owner``'s run (ids, owner and creation time are immutable)."""
        refused = (set(fields) - set(TrainingRunRecord.model_fields)) | (
            _FROZEN_RUN_FIELDS & set(fields)
        )
        if refused:
            raise BadRequestError(f"cannot update run fields {sorted(refused)}")

        def change(record: TrainingRunRecord) -> TrainingRunRecord:
            return TrainingRunRecord.model_validate({**record.model_dump(), **fields})

        return self._modify(
            RUN + self._text_id(run_id, "run_id"), TrainingRunRecord, owner, "training run", change
        )

    # -- sampling sessions ----------------------------------------------------------------------
    def create_sampling_session(
        self,
        owner: str,
        session_id: str,
        base_model: str | None = None,
        model_path: str | None = None,
        adapter_dir: str | None = None,
        sampling_session_id: str | None = None,
    ) -> SamplingSessionRecord:
        """Register a sampling session in ``owner``'s session."""
        self.get_session(owner, session_id)
        record = SamplingSessionRecord(
            sampling_session_id=validate_id(
                sampling_session_id or new_id("samp"), "sampling session id"
            ),
            owner=owner,
            session_id=session_id,
            base_model=base_model,
            model_path=model_path,
            adapter_dir=adapter_dir,
            created_at=self.clock(),
        )
        self._create(SAMPLING + record.sampling_session_id, record, "sampling session")
        return record

    def get_sampling_session(self, owner: str, sampling_session_id: str) -> SamplingSessionRecord:
        """``owner``'s sampling session, or :class:`NotFoundError`."""
        return self._load(
            SAMPLING + self._text_id(sampling_session_id, "sampling_session_id"),
            SamplingSessionRecord,
            owner,
            "sampling session",
        )

    # -- what a tenant keeps ----------------------------------------------------------------------
    def compact_sessions(self, owner: str | None = None, spare: str | None = None) -> list[str]:
        """Compact the finished sessions (of ``owner``, else of every tenant) past
        ``keep_finished_sessions`` (oldest first, by last heartbeat) or older than
        ``finished_session_ttl_s``, never ``spare``; returns their ids."""
        limits, now = self.limits, self.clock()
        finished: dict[str, list[SessionRecord]] = {}
        for s in self._all(SESSION, SessionRecord, owner):
            if s.finished and s.session_id != spare:
                finished.setdefault(s.owner, []).append(s)
        keep = max(limits.keep_finished_sessions - (spare is not None), 0)
        ttl = limits.finished_session_ttl_s
        doomed = []
        for sessions in finished.values():
            sessions.sort(key=lambda s: (s.last_heartbeat, s.created_at), reverse=True)
            doomed += [
                s
                for i, s in enumerate(sessions)
                if i >= keep or (ttl is not None and s.last_heartbeat < now - ttl)
            ]
        for session in doomed:
            self._compact_session(session)
        return [s.session_id for s in doomed]

    def stored_metadata_bytes(self, owner: str) -> int:
        """What ``owner``'s sessions and runs store as ``user_metadata`` and ``tags`` (bytes)."""
        ledger = self.store.get(QUOTA + owner) or {}
        return sum(entry[0] for entry in ledger.get("records", {}).values())

    def _capped(self, size: int, what: str, also: str) -> int:
        cap = self.limits.max_metadata_bytes
        if size > cap:
            fields = f"user_metadata {also}".strip()
            raise PayloadTooLarge(
                f"{fields} of {what} take {size} bytes as JSON; "
                f"at most max_metadata_bytes={cap} are kept"
            )
        return size

    def _create_counted(self, key: str, record: Any, what: str, size: int) -> None:
        """Create ``record`` at ``key`` with its ``size`` bytes counted in its owner's ledger
        first (a crash in between leaves an entry that :meth:`_make_room` later drops)."""
        owner = record.owner
        if size:
            self._reserve(owner, key, size)
        try:
            self._create(key, record, what)
        except BaseException:
            if size:
                self.store.update(QUOTA + owner, _ledger_drop([key]))
            raise

    def _reserve(self, owner: str, key: str, size: int) -> None:
        limit = self.limits.max_tenant_metadata_bytes
        try:
            self.store.update(QUOTA + owner, _ledger_add(owner, key, size, self.clock(), limit))
        except OverQuotaError:
            self._make_room(owner, size)
            self.store.update(QUOTA + owner, _ledger_add(owner, key, size, self.clock(), limit))

    def _make_room(self, owner: str, size: int) -> None:
        """Drop ``owner``'s stale ledger entries, then compact its finished sessions, oldest
        first, until ``size`` more bytes fit (or none is left)."""
        records = (self.store.get(QUOTA + owner) or {}).get("records", {})
        old = self.clock() - STALE_ENTRY_S
        stale = [k for k, (_, at) in records.items() if at < old and not self._holds(k, owner)]
        if stale:
            self.store.update(QUOTA + owner, _ledger_drop(stale))
        used = self.stored_metadata_bytes(owner)
        finished = [s for s in self._all(SESSION, SessionRecord, owner) if s.finished]
        for session in sorted(finished, key=lambda s: (s.last_heartbeat, s.created_at)):
            if used + size <= self.limits.max_tenant_metadata_bytes:
                return
            used -= self._compact_session(session)

    def _holds(self, key: str, owner: str) -> bool:
        """Whether the record at ``key`` exists, is ``owner``'s and stores metadata."""
        raw = self.store.get(key)
        return bool(
            raw and raw.get("owner") == owner and (raw.get("user_metadata") or raw.get("tags"))
        )

    def _compact_session(self, session: SessionRecord) -> int:
        """Delete a finished session's records (session, info, sampling sessions), drop its
        runs' ``user_metadata`` (the runs stay for their checkpoints) and release their bytes;
        returns the bytes released. Idempotent: a second compaction releases nothing."""
        owner, sid = session.owner, session.session_id
        counted = (self.store.get(QUOTA + owner) or {}).get("records", {})
        runs = [r for r in self._all(RUN, TrainingRunRecord, owner) if r.session_id == sid]
        for run in runs:
            if run.user_metadata:
                self.store.update(RUN + run.training_run_id, _without_metadata(owner))
        keys = [SESSION + sid] + [RUN + r.training_run_id for r in runs]
        for sampler in self._all(SAMPLING, SamplingSessionRecord, owner):
            if sampler.session_id == sid:
                self.store.delete(SAMPLING + sampler.sampling_session_id)
        self.store.delete(SESSION_INFO + sid)
        self.store.delete(SESSION + sid)
        self.store.update(QUOTA + owner, _ledger_drop(keys))
        return sum(counted[k][0] for k in keys if k in counted)


def _without_metadata(owner: str):
    def drop(current: dict[str, Any] | None) -> dict[str, Any] | None:
        if current is None or current.get("owner") != owner:
            return current
        return {**current, "user_metadata": {}}

    return drop


def check_name(value: Any, field: str) -> None:
    """A 400 naming ``field`` when a session's descriptive string is over
    :data:`MAX_NAME_CHARS` (``None`` passes)."""
    if isinstance(value, str) and len(value) > MAX_NAME_CHARS:
        raise BadRequestError(f"{field} is {len(value)} characters; at most {MAX_NAME_CHARS}")
