"""``DataParallelSampler``: ``dp_size`` sampler replicas (Ray actors); each request goes to the
least loaded one (ties: round robin). Configuration calls reach every replica."""

from __future__ import annotations

import threading
from typing import Any

from twinkle.parallel._replicas import ReplicaSet, placement_options


class _SamplerWorker:
    def __init__(self, sampler: Any, kwargs: dict[str, Any]) -> None:
        if isinstance(sampler, str):
            import twinkle.sampler

            sampler = getattr(twinkle.sampler, sampler)
        self.sampler = sampler(**kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.sampler, method)(*args, **kwargs)

    def placement(self) -> dict[str, Any]:
        from twinkle.parallel.placement import placement_report

        return placement_report(getattr(self.sampler, "device", None))


class DataParallelSampler:
    """A sampler (``'TorchSampler'``, ``'vLLMSampler'`` or a class) replicated ``dp_size`` times.

    Args:
        sampler: The sampler class or its name in ``twinkle.sampler``.
        dp_size: Number of replicas.
        num_cpus / num_gpus / resources: What each replica reserves in Ray.
        placement_group: Put replica ``i`` into bundle ``i`` of this placement group.
        nproc_per_node: Without ``placement_group``: pack this many replicas on each node.
        **sampler_kwargs: Passed to every replica's constructor (``model_id=...``).
    """

    def __init__(
        self,
        sampler: Any,
        dp_size: int,
        *,
        num_cpus: float = 1.0,
        num_gpus: float = 0,
        resources: dict[str, float] | None = None,
        placement_group: Any = None,
        nproc_per_node: int | None = None,
        **sampler_kwargs: Any,
    ) -> None:
        import ray

        if dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {dp_size}")
        options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": 0}
        if resources:
            options["resources"] = dict(resources)
        remote = ray.remote(_SamplerWorker)
        self._packing = None
        if nproc_per_node and placement_group is None:
            from twinkle.parallel.placement import NodePacking, rank_bundle

            bundle = rank_bundle(num_cpus, num_gpus, resources)
            self._packing = NodePacking(dp_size, nproc_per_node, bundle)

        def start(rank: int) -> Any:
            where = (
                self._packing.options(rank)
                if self._packing is not None
                else placement_options(placement_group, rank)
            )
            return remote.options(**options, **where).remote(sampler, sampler_kwargs)

        self.dp_size = dp_size
        self.replicas = ReplicaSet(start, dp_size)
        self.in_flight = [0] * dp_size
        self.served = [0] * dp_size
        self._next = 0
        self._lock = threading.Lock()

    def _pick(self) -> int:
        with self._lock:
            least = min(self.in_flight)
            candidates = [r for r in range(self.dp_size) if self.in_flight[r] == least]
            rank = min(candidates, key=lambda r: (r - self._next) % self.dp_size)
            self._next = (rank + 1) % self.dp_size
            self.in_flight[rank] += 1
            return rank

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        """``Sampler.sample`` on the least loaded replica."""
        rank = self._pick()
        try:
            return self.replicas.call("call", "sample", *args, ranks=[rank], **kwargs)[0]
        finally:
            with self._lock:
                self.in_flight[rank] -= 1
                self.served[rank] += 1

    def set_template(self, template: Any, **kwargs: Any) -> None:
        """Set the template on every replica."""
        self.replicas.call("call", "set_template", template, **kwargs)

    def recover(self) -> None:
        """Restart every replica after a ``WorkerLostError`` (configuration must be set again)."""
        self.replicas.restart()

    def placements(self) -> list[dict[str, Any]]:
        """Each replica's node id, assigned resources and ``CUDA_VISIBLE_DEVICES``."""
        return self.replicas.call("placement")

    def shutdown(self) -> None:
        self.replicas.kill()
        if self._packing is not None:
            self._packing.remove()


__all__ = ["DataParallelSampler"]
