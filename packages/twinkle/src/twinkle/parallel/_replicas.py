"""A set of Ray actors, one per rank, called together; a dead actor becomes a ``WorkerLostError``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twinkle.parallel.errors import WorkerLostError


def placement_options(placement_group: Any, rank: int) -> dict[str, Any]:
    """Actor options that put ``rank`` into bundle ``rank`` of ``placement_group`` (if any)."""
    if placement_group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles = len(placement_group.bundle_specs)
    if rank >= bundles:
        raise ValueError(f"rank {rank} does not fit the placement group's {bundles} bundle(s)")
    return {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=placement_group, placement_group_bundle_index=rank
        )
    }


class ReplicaSet:
    """``size`` actors built by ``factory(rank)``; calls go to all ranks (or some) and are gathered.

    After an actor dies every survivor is killed too (they may be blocked in a collective with the
    dead one) and the set is ``lost`` until ``restart``.
    """

    def __init__(self, factory: Callable[[int], Any], size: int) -> None:
        self.factory, self.size = factory, size
        self.actors: list[Any] = []
        self.lost: WorkerLostError | None = None
        self.restart()

    def restart(self) -> None:
        self.kill()
        self.actors = [self.factory(rank) for rank in range(self.size)]
        self.lost = None

    def kill(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        self.actors = []

    def check(self) -> None:
        if self.lost is not None:
            raise WorkerLostError(self.lost.rank, "earlier")

    def submit(
        self,
        method: str,
        per_rank: list[tuple[tuple, dict]] | None = None,
        *args: Any,
        ranks: list[int] | None = None,
        **kwargs: Any,
    ) -> list[tuple[int, Any]]:
        """Start ``method`` on ``ranks`` (default all); ``per_rank`` gives each rank its own args."""
        self.check()
        ranks = list(range(self.size)) if ranks is None else ranks
        refs = []
        for rank in ranks:
            rank_args, rank_kwargs = per_rank[rank] if per_rank is not None else (args, kwargs)
            refs.append(
                (rank, getattr(self.actors[rank], method).remote(*rank_args, **rank_kwargs))
            )
        return refs

    def gather(self, refs: list[tuple[int, Any]], timeout_s: float | None = None) -> list[Any]:
        """Results in rank order; the first real error wins over peers' "another rank failed".

        Raises:
            WorkerLostError: An actor died (the whole set is then killed).
            TimeoutError: ``timeout_s`` passed (e.g. actors that never schedule).
        """
        import time

        import ray
        from ray.exceptions import RayActorError, RayTaskError

        from twinkle.parallel._worker import PeerFailedError

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        by_ref = {ref: rank for rank, ref in refs}
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        while by_ref:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=left)
            if not ready:
                ranks = sorted(by_ref.values())
                raise TimeoutError(
                    f"ranks {ranks} did not answer within {timeout_s:g} s: are their resources "
                    f"(CPUs, GPUs, custom labels) available in the Ray cluster? {ray.available_resources()}"
                )
            for ref in ready:
                rank = by_ref.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except RayActorError as exc:
                    self.lost = WorkerLostError(rank, type(exc).__name__)
                    self.kill()
                    raise self.lost from exc
                except RayTaskError as exc:
                    errors[rank] = exc.as_instanceof_cause()
        if errors:
            real = [e for e in errors.values() if not isinstance(e, PeerFailedError)]
            raise (real or list(errors.values()))[0]
        return [results[rank] for rank, _ in refs]

    def call(
        self,
        method: str,
        *args: Any,
        ranks: list[int] | None = None,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        return self.gather(self.submit(method, None, *args, ranks=ranks, **kwargs), timeout_s)


__all__ = ["ReplicaSet", "placement_options"]
