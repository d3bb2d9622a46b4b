"""Checkpoints of :class:`ServerState`: registration, retention, TTL, publishing, path resolution."""

from __future__ import annotations

from twinkle.server.state._base import StateBase
from twinkle.server.state._sessions import RUN, SESSION
from twinkle.server.state.errors import NotFoundError
from twinkle.server.state.paths import (
    checkpoint_path,
    parse_checkpoint_id,
    parse_checkpoint_path,
    validate_checkpoint_name,
    validate_kind,
    validate_ttl,
)
from twinkle.server.state.records import (
    CHECKPOINT_TYPE_BY_KIND,
    CheckpointRecord,
    TrainingRunRecord,
)

CKPT = "ckpt/"


def _key(run_id: str, kind: str, name: str) -> str:
    return f"{CKPT}{run_id}/{kind}/{name}"


class CheckpointsMixin(StateBase):
    """Checkpoint records; files are the caller's business (it deletes what eviction returns)."""

    def add_checkpoint(
        self,
        owner: str,
        run_id: str,
        kind: str,
        name: str,
        local_dir: str,
        size_bytes: int | None = None,
        ttl_seconds: float | None = None,
        keep_last: int | None = None,
        overwrite: bool = True,
    ) -> tuple[CheckpointRecord, list[CheckpointRecord]]:
        """Register a saved checkpoint of ``owner``'s run and apply retention.

        Args:
            kind: ``weights`` (training state) or ``sampler_weights``.
            ttl_seconds: Expire the checkpoint this many seconds from now (``None``: never).
            keep_last: Keep at most this many checkpoints of this kind in the run (the new one
                included); the oldest unpublished ones are removed from the state.
            overwrite: Replace an existing checkpoint of the same name instead of raising
                :class:`ConflictError`.

        Returns:
            The new record and the evicted records, whose files the caller must delete.
        """
        self.get_run(owner, run_id)
        validate_kind(kind)
        validate_checkpoint_name(name)
        ttl_seconds = validate_ttl(ttl_seconds)
        now = self.clock()
        record = CheckpointRecord(
            training_run_id=run_id,
            owner=owner,
            checkpoint_id=f"{kind}/{name}",
            checkpoint_type=CHECKPOINT_TYPE_BY_KIND[kind],
            name=name,
            time=now,
            path=checkpoint_path(run_id, kind, name),
            local_dir=str(local_dir),
            size_bytes=size_bytes,
            expires_at=None if ttl_seconds is None else now + ttl_seconds,
        )
        if overwrite:
            self.store.put(_key(run_id, kind, name), record.model_dump(mode="json"))
        else:
            self._create(_key(run_id, kind, name), record, "checkpoint")
        evicted = self._evict(owner, run_id, kind, keep_last, keep=name) if keep_last else []
        self._set_last(owner, run_id, kind)
        return record, evicted

    def _evict(
        self, owner: str, run_id: str, kind: str, keep_last: int, keep: str
    ) -> list[CheckpointRecord]:
        others = [
            c
            for c in self.list_checkpoints(owner, run_id)
            if c.kind == kind and c.name != keep and not c.public
        ]
        others.sort(key=lambda c: (c.time, c.name), reverse=True)
        evicted = others[max(keep_last - 1, 0) :]
        for record in evicted:
            self.store.delete(_key(run_id, kind, record.name))
        return evicted

    def _set_last(self, owner: str, run_id: str, kind: str) -> None:
        """Point the run's ``last_(sampler_)checkpoint`` at its newest checkpoint of ``kind``."""
        same = [c for c in self.list_checkpoints(owner, run_id) if c.kind == kind]
        newest = max(same, key=lambda c: (c.time, c.name), default=None)
        field = "last_checkpoint" if kind == "weights" else "last_sampler_checkpoint"
        value = None if newest is None else newest.to_tinker()
        self._modify(
            RUN + run_id,
            TrainingRunRecord,
            owner,
            "training run",
            lambda r: r.model_copy(update={field: value}),
        )

    def get_checkpoint(self, owner: str, run_id: str, checkpoint_id: str) -> CheckpointRecord:
        """``owner``'s checkpoint ``weights/<name>`` or ``sampler_weights/<name>`` of a run.

        An expired checkpoint is not found, whether or not the sweeper has deleted it yet:
        expiry is one state, seen the same by every reader at once."""
        record = self.get_stored_checkpoint(owner, run_id, checkpoint_id)
        if record.is_expired(self.clock()):
            raise NotFoundError("checkpoint not found")
        return record

    def get_stored_checkpoint(
        self, owner: str, run_id: str, checkpoint_id: str
    ) -> CheckpointRecord:
        """The stored record of ``owner``'s checkpoint, expired or not (for the sweeper, which
        deletes expired ones; every other reader uses :meth:`get_checkpoint`)."""
        kind, name = parse_checkpoint_id(checkpoint_id)
        return self._load(_key(run_id, kind, name), CheckpointRecord, owner, "checkpoint")

    def list_checkpoints(self, owner: str, run_id: str) -> list[CheckpointRecord]:
        """The unexpired checkpoints of ``owner``'s run, oldest first (NotFoundError for a
        foreign run)."""
        self.get_run(owner, run_id)
        now = self.clock()
        found = self._all(f"{CKPT}{run_id}/", CheckpointRecord, owner)
        return sorted(
            (c for c in found if not c.is_expired(now)), key=lambda c: (c.time, c.checkpoint_id)
        )

    def delete_checkpoint(self, owner: str, run_id: str, checkpoint_id: str) -> CheckpointRecord:
        """Forget a checkpoint, expired or not, and return its record (the caller deletes
        ``local_dir``). The record is removed in one atomic step: of two deleters racing, one
        gets the record and the other :class:`NotFoundError`."""
        record = self.get_stored_checkpoint(owner, run_id, checkpoint_id)

        def forget(current: dict | None) -> None:
            if current is None or current.get("owner") != owner:
                raise NotFoundError("checkpoint not found")
            return None

        self.store.update(_key(run_id, record.kind, record.name), forget)
        self._set_last(owner, run_id, record.kind)
        return record

    def set_checkpoint_ttl(
        self, owner: str, run_id: str, checkpoint_id: str, ttl_seconds: float | None
    ) -> CheckpointRecord:
        """Expire the checkpoint ``ttl_seconds`` from now (``None`` removes the expiry)."""
        ttl_seconds = validate_ttl(ttl_seconds)
        expires_at = None if ttl_seconds is None else self.clock() + ttl_seconds
        return self._change(owner, run_id, checkpoint_id, expires_at=expires_at)

    def set_checkpoint_public(
        self, owner: str, run_id: str, checkpoint_id: str, public: bool
    ) -> CheckpointRecord:
        """Publish (or unpublish) a checkpoint: public ones may be loaded by other tenants."""
        return self._change(owner, run_id, checkpoint_id, public=bool(public))

    def _change(self, owner: str, run_id: str, checkpoint_id: str, **fields) -> CheckpointRecord:
        """Change an unexpired checkpoint's record: an expired one is gone, so neither a new TTL
        nor publishing brings it back (checked inside the atomic update)."""
        kind, name = parse_checkpoint_id(checkpoint_id)
        now = self.clock()

        def change(record: CheckpointRecord) -> CheckpointRecord:
            if record.is_expired(now):
                raise NotFoundError("checkpoint not found")
            return record.model_copy(update=fields)

        record = self._modify(
            _key(run_id, kind, name), CheckpointRecord, owner, "checkpoint", change
        )
        self._set_last(owner, run_id, kind)
        return record

    def expired_checkpoints(self, now: float | None = None) -> list[CheckpointRecord]:
        """Checkpoints of every owner that the sweeper deletes: those whose TTL has passed, and
        the ephemeral sampler snapshots of a finished session (made for that session's sampling
        clients only, so nothing can read them once it ended; their TTL is only the backstop)."""
        now = self.clock() if now is None else now
        finished: dict[str, bool] = {}
        return [
            c
            for c in self._all(CKPT, CheckpointRecord)
            if c.is_expired(now)
            or (c.ephemeral and self._run_finished(c.training_run_id, finished))
        ]

    def _run_finished(self, run_id: str, cache: dict[str, bool]) -> bool:
        """Whether the session that made training run ``run_id`` has finished (or is gone)."""
        if run_id not in cache:
            run = self.store.get(RUN + run_id)
            session = self.store.get(SESSION + str(run.get("session_id"))) if run else None
            cache[run_id] = session is None or bool(session.get("finished"))
        return cache[run_id]

    def resolve_checkpoint_path(
        self, owner: str, path: str, allow_public: bool = False
    ) -> CheckpointRecord:
        """The checkpoint behind ``twinkle://<run>/<kind>/<name>`` (or ``tinker://...``).

        Only ``owner``'s checkpoints resolve, plus other tenants' published ones when
        ``allow_public`` (loading weights). Expired checkpoints do not resolve.

        Raises:
            BadRequestError: Malformed path or name.
            NotFoundError: Missing, expired, or another tenant's unpublished checkpoint.
        """
        run_id, kind, name = parse_checkpoint_path(path)
        raw = self.store.get(_key(run_id, kind, name))
        record = None if raw is None else CheckpointRecord.model_validate(raw)
        visible = record is not None and (record.owner == owner or (allow_public and record.public))
        if not visible or record.is_expired(self.clock()):
            raise NotFoundError(f"checkpoint {path} not found")
        return record
