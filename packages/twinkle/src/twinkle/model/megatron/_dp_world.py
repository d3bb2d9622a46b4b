"""Data parallel inside one megatron world (``dp_size * pp_size * tp_size`` worker processes).

megatron-core's ``initialize_model_parallel(tp, pp)`` over the whole world makes the rest of it
data parallel: each data-parallel group holds the ranks of one (tp rank, stage) across the dp
replicas. The driver splits every tenant's rows of a ``forward_backward_many`` over the dp
replicas (:mod:`twinkle.parallel._sharding`, pairs kept together for DPO); each replica runs its
rows through its tp x pp model, then each tenant's gradients are scaled by the replica's share
of that tenant's normaliser (tokens, rows, ... of the combined batch) and all-reduced over the
dp group: :class:`twinkle.parallel._worker.ReplicaWorker`'s synchronisation, reused as is, with
its collectives on megatron's dp group instead of the whole world. Every replica then holds the
same gradients, so clipping and Adam stay replicated; other calls (``forward_only``, the
``forward``/``backward`` path, optimizer steps, checkpoints) run the same request on every
replica, which gives every replica the same result.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from twinkle.parallel import _sharding
from twinkle.parallel import _worker as replica_worker


class _OnGroup:
    """``torch.distributed`` whose ``all_reduce`` runs on ``group`` (megatron's dp group)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, **kwargs):
        return dist.all_reduce(tensor, op=op, group=self.group)

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)


def replica_sync(model: Any, dp_rank: int, dp_size: int) -> Any:
    """A ``ReplicaWorker`` around this rank's ``model`` whose gradient synchronisation runs on
    megatron's data-parallel group (this worker process holds one model: the module's ``dist``
    is replaced for the process)."""
    from megatron.core import parallel_state as ps

    replica_worker.dist = _OnGroup(ps.get_data_parallel_group())
    sync = replica_worker.ReplicaWorker.__new__(replica_worker.ReplicaWorker)
    sync.rank, sync.world_size, sync.model = dp_rank, dp_size, model
    sync.device = str(model.device)
    return sync


def split_requests(
    requests: dict[str, dict[str, Any]], dp_size: int, pair_rows: set[str]
) -> tuple[list[str], list[dict[str, Any]]]:
    """The tenants' order and each dp replica's ``{tenant: its rows' request or None}``."""
    order = list(requests)
    split = {}
    for name, request in requests.items():
        rows = _sharding.row_count(request["inputs"])
        unit = 2 if name in pair_rows else 1
        split[name] = _sharding.split_request(
            dict(request), _sharding.shard_bounds(rows, dp_size, unit)
        )
    return order, [{name: split[name][d] for name in order} for d in range(dp_size)]


def join(order: list[str], results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The replicas' results (in dp order = row order) as each tenant's one result."""
    return {name: _sharding.join_results(name, results) for name in order}


__all__ = ["join", "replica_sync", "split_requests"]
