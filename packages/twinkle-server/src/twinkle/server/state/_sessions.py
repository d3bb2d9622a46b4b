"""Sessions, training runs and sampling sessions of :class:`ServerState`."""

from __future__ import annotations

from typing import Any

from twinkle.server.state._base import StateBase, new_id
from twinkle.server.state.errors import BadRequestError, ConflictError, GoneError
from twinkle.server.state.paths import validate_id
from twinkle.server.state.records import SamplingSessionRecord, SessionRecord, TrainingRunRecord

SESSION, RUN, SAMPLING = "session/", "run/", "sampling/"
_FROZEN_RUN_FIELDS = frozenset({"training_run_id", "owner", "session_id", "created_at"})


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
        """Open a session for ``owner`` (a fresh random id unless ``session_id`` is given)."""
        now = self.clock()
        record = SessionRecord(
            session_id=validate_id(session_id or new_id("sess"), "session id"),
            owner=self._owner(owner),
            created_at=now,
            last_heartbeat=now,
            tags=list(tags or []),
            user_metadata=dict(user_metadata or {}),
            sdk_version=sdk_version,
        )
        self._create(SESSION + record.session_id, record, "session")
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
        """Mark the session finished (idempotent)."""
        return self._modify(
            SESSION + session_id,
            SessionRecord,
            owner,
            "session",
            lambda r: r.model_copy(update={"finished": True}),
        )

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
            user_metadata=dict(user_metadata or {}),
            adapter_name=adapter_name,
        )
        self._create(RUN + record.training_run_id, record, "training run")
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
