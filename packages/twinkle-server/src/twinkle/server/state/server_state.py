"""The server's domain state: sessions, runs, checkpoints, futures and samplers over a KVStore.

Every read and write names the ``owner`` (tenant id) it acts for; another owner's record behaves
exactly like a missing one. Single records change atomically through ``KVStore.update``; operations
spanning several records (a checkpoint and its run's ``last_checkpoint``) are not transactional, and
are written so that a crash between steps leaves only a stale pointer, never a lost record.
"""

from __future__ import annotations

from twinkle.server.state._activity import ActivityMixin
from twinkle.server.state._base import StateLimits
from twinkle.server.state._checkpoints import CheckpointsMixin
from twinkle.server.state._futures import FUTURE, FuturesMixin
from twinkle.server.state._history import HistoryMixin
from twinkle.server.state._sessions import RUN, SAMPLING, SESSION, SessionsMixin
from twinkle.server.state.records import (
    FutureRecord,
    SamplingSessionRecord,
    SessionRecord,
    TrainingRunRecord,
)


class ServerState(ActivityMixin, SessionsMixin, CheckpointsMixin, FuturesMixin, HistoryMixin):
    """All server records over one :class:`~twinkle.server.state.KVStore`.

    Args:
        store: Memory, file or Redis store (see :func:`~twinkle.server.state.create_store`).
        clock: Seconds since the epoch; tests inject a fake one.
        limits: What one tenant may keep (:class:`StateLimits`: metadata sizes, finished
            sessions); the gateway's ``server`` args set them.

    Example:
        >>> state = ServerState(MemoryStore())
        >>> session = state.create_session("tenant-a")
        >>> run = state.create_run("tenant-a", session.session_id, "Qwen/Qwen3-0.6B", lora_rank=8)
    """

    def counts(self) -> dict[str, int]:
        """Gauges for metrics: live sessions, active models, sampling sessions, pending futures."""
        sessions = [SessionRecord.model_validate(v) for _, v in self.store.scan(SESSION)]
        runs = [TrainingRunRecord.model_validate(v) for _, v in self.store.scan(RUN)]
        futures = [FutureRecord.model_validate(v) for _, v in self.store.scan(FUTURE)]
        return {
            "active_sessions": sum(not s.finished for s in sessions),
            "models": sum(r.status == "active" for r in runs),
            "sampling_sessions": len(self._all(SAMPLING, SamplingSessionRecord)),
            "futures": sum(f.status == "pending" for f in futures),
        }


__all__ = ["ServerState", "StateLimits"]
