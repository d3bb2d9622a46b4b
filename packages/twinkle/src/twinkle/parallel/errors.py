"""Errors of data-parallel models and samplers."""

from __future__ import annotations


class WorkerLostError(RuntimeError):
    """A data-parallel worker (Ray actor) died; the replicas must be recovered.

    Attributes:
        rank: The rank whose actor died.
    """

    def __init__(self, rank: int, detail: str = "") -> None:
        self.rank = rank
        super().__init__(
            f"data-parallel worker rank {rank} was lost{': ' + detail if detail else ''}. Pending and "
            "further calls fail until recover() restarts the replicas and reloads each adapter from "
            "its last checkpoint"
        )


class AdapterLostError(RuntimeError):
    """An adapter's state is gone or untrusted (lost with a worker, or replicas diverged).

    It raises on every use until ``add_adapter_to_model`` re-creates it or ``resume_from_checkpoint``
    / ``load`` restores it.
    """


__all__ = ["AdapterLostError", "WorkerLostError"]
