"""Where a model deployment records training runs and checkpoints.

The deployment needs a narrow slice of the server state: create runs, count a tenant's active
adapters, register checkpoints and resolve ``twinkle://`` paths back to directories, always within
one tenant. :class:`RunRegistry` is that slice; :class:`StateRunRegistry` implements it over the
shared ``ServerState`` (memory, file or Redis).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

from twinkle.server.state.errors import NotFoundError
from twinkle.server.web.errors import BadRequest

#: How long a reserved adapter slot counts while its run record is not written yet: far longer
#: than the one store write between the reservation and the record (a process killed in between
#: holds the slot that long).
RESERVATION_S = 120.0


class RunRegistry(Protocol):
    def create_run(
        self,
        owner: str,
        *,
        adapter_name: str,
        base_model: str,
        lora_rank: int,
        lora_config: dict,
        session_id: str | None,
        training_run_id: str | None = None,
        model_seq_id: int = 0,
        user_metadata: dict | None = None,
        limit: int | None = None,
    ) -> str: ...
    def count_active_runs(self, owner: str) -> int: ...
    def active_runs(self, owner: str, base_model: str) -> list: ...
    def runs_named(self, owner: str, base_model: str, adapter_name: str) -> list: ...
    def set_run_status(self, owner: str, run_id: str, status: str) -> None: ...
    def checkpoint_dir(self, owner: str, run_id: str, kind: str, name: str) -> Path: ...
    def add_checkpoint(
        self, owner: str, run_id: str, kind: str, name: str, ttl_s: float | None = None
    ) -> str: ...
    def delete_checkpoint(
        self, owner: str, run_id: str, kind: str, name: str, only_expired: bool = False
    ) -> str | None: ...
    def resolve_checkpoint(self, owner: str, path: str, allow_public: bool = True) -> Path: ...


class StateRunRegistry:
    """The persistent :class:`RunRegistry`: runs and checkpoints in the shared ``ServerState``.

    Args:
        state: The server state (memory actor, file or Redis).
        storage_root: Root of the per-tenant checkpoint directories.
        keep_last: Checkpoints kept per run and kind (older ones are deleted, files included).
        checkpoint_ttl_s: Default time to live of new checkpoints.
    """

    def __init__(
        self,
        state,
        storage_root: str | Path,
        keep_last: int | None = None,
        checkpoint_ttl_s: float | None = None,
    ) -> None:
        self.state = state
        self.root = Path(storage_root).expanduser().resolve()
        self.keep_last, self.checkpoint_ttl_s = keep_last, checkpoint_ttl_s

    def create_run(
        self,
        owner,
        *,
        adapter_name,
        base_model,
        lora_rank,
        lora_config,
        session_id,
        training_run_id=None,
        model_seq_id=0,
        user_metadata=None,
        limit=None,
    ):
        """A new active run; ``training_run_id`` names it exactly (a Tinker run's model id),
        else it is ``<adapter_name>-<random>`` (in an implicit session when none is given).

        With ``limit`` (the key's ``per_token_model_limit``) the run first takes one of
        ``owner``'s adapter slots, atomically (:meth:`_reserve_slot`): however many creations
        race, on however many replicas and models, at most ``limit`` runs are active at once.

        Raises:
            BadRequest: ``owner`` already holds ``limit`` adapters.
        """
        run_id = training_run_id or f"{adapter_name}-{uuid.uuid4().hex[:8]}"
        if limit is not None:
            self._reserve_slot(owner, run_id, limit)
        try:
            if not session_id:
                session_id = self.state.create_session(owner, tags=["implicit"]).session_id
            self.state.create_run(
                owner,
                session_id,
                base_model,
                lora_rank,
                model_seq_id=model_seq_id,
                lora_config=lora_config,
                user_metadata=user_metadata or {},
                training_run_id=run_id,
                adapter_name=adapter_name,
            )
        except BaseException:
            if limit is not None:
                self._release_slot(owner, run_id)
            raise
        return run_id

    def _reserve_slot(self, owner: str, run_id: str, limit: int) -> None:
        """Count ``owner``'s held adapters and take one more slot in ONE atomic store update.

        Held: the runs whose status is ``active``, plus the slots reserved by creations whose
        run record was not written yet when the runs were read (so a creation that finishes
        in between is still counted, through its reservation). A reservation is dropped once
        its run record exists (counted as active, or released) or after
        :data:`RESERVATION_S`.
        """
        runs, _ = self.state.list_runs(owner, limit=10**6)
        active = {r.training_run_id for r in runs if r.status == "active"}
        known = {r.training_run_id for r in runs}
        now = self.state.clock()

        def take(current: dict[str, Any] | None) -> dict[str, Any]:
            pending = {
                rid: at
                for rid, at in ((current or {}).get("pending") or {}).items()
                if rid not in known and now - at < RESERVATION_S
            }
            if len(active | set(pending)) < limit:
                pending[run_id] = now
            return {"pending": pending}

        if run_id not in self.state.store.update(_slots_key(owner), take)["pending"]:
            raise BadRequest(
                f"this API key already holds {limit} adapters (per_token_model_limit); "
                "remove one first"
            )

    def _release_slot(self, owner: str, run_id: str) -> None:
        """Give back the slot of a creation that failed before its run record was written."""

        def drop(current: dict[str, Any] | None) -> dict[str, Any]:
            pending = dict((current or {}).get("pending") or {})
            pending.pop(run_id, None)
            return {"pending": pending}

        self.state.store.update(_slots_key(owner), drop)

    def count_active_runs(self, owner):
        runs, _ = self.state.list_runs(owner, limit=10**6)
        return sum(1 for r in runs if r.status == "active")

    def active_runs(self, owner, base_model):
        """``owner``'s runs on ``base_model`` whose status is ``active``."""
        runs, _ = self.state.list_runs(owner, limit=10**6)
        return [r for r in runs if r.status == "active" and r.base_model == base_model]

    def runs_named(self, owner, base_model, adapter_name):
        """``owner``'s runs on ``base_model`` of adapter ``adapter_name``, oldest first."""
        runs, _ = self.state.list_runs(owner, limit=10**6)
        named = [r for r in runs if r.adapter_name == adapter_name and r.base_model == base_model]
        return sorted(named, key=lambda r: r.created_at)

    def set_run_status(self, owner, run_id, status):
        self.state.update_run(owner, run_id, status="unloaded" if status == "removed" else status)

    def checkpoint_dir(self, owner, run_id, kind, name):
        from twinkle.server.state import checkpoint_dir

        return checkpoint_dir(self.root, owner, run_id, kind, name)

    def add_checkpoint(self, owner, run_id, kind, name, ttl_s=None):
        """Register the checkpoint just written (expiring in ``ttl_s``, else the server's
        default TTL), delete what retention evicts, files included; returns its path."""
        directory = self.checkpoint_dir(owner, run_id, kind, name)
        size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
        record, evicted = self.state.add_checkpoint(
            owner,
            run_id,
            kind,
            name,
            str(directory),
            size_bytes=size,
            ttl_seconds=self.checkpoint_ttl_s if ttl_s is None else ttl_s,
            keep_last=self.keep_last,
        )
        for old in evicted:
            shutil.rmtree(old.local_dir, ignore_errors=True)
        return record.path

    def delete_checkpoint(self, owner, run_id, kind, name, only_expired=False):
        """See :func:`delete_checkpoint` (this runs it on the model thread, in the queue of the
        adapter that saves into the run)."""
        return delete_checkpoint(self.state, owner, run_id, kind, name, only_expired)

    def resolve_checkpoint(self, owner, path, allow_public=True):
        """The directory of ``owner``'s checkpoint at ``path`` (or, with ``allow_public``, of
        another tenant's published one); ``NotFound`` otherwise."""
        record = self.state.resolve_checkpoint_path(owner, path, allow_public=allow_public)
        return Path(record.local_dir)


def _slots_key(owner: str) -> str:
    """Where ``owner``'s reserved adapter slots are kept (see ``_reserve_slot``)."""
    return f"slots/{owner}"


def delete_checkpoint(
    state: Any, owner: str, run_id: str, kind: str, name: str, only_expired: bool = False
) -> str | None:
    """Forget ``owner``'s checkpoint ``kind/name`` of ``run_id`` and delete its files; returns
    its path. With ``only_expired`` (the sweeper): ``None``, touching nothing, when it is gone
    or no longer expired (saved again since the sweeper listed it).

    Raises:
        NotFoundError: No such checkpoint (without ``only_expired``).
    """
    checkpoint_id = f"{kind}/{name}"
    try:
        record = state.get_stored_checkpoint(owner, run_id, checkpoint_id)
        if only_expired and not record.is_expired(state.clock()):
            return None
        record = state.delete_checkpoint(owner, run_id, checkpoint_id)
    except NotFoundError:
        if only_expired:
            return None
        raise
    shutil.rmtree(record.local_dir, ignore_errors=True)
    return record.path
