"""Data parallel inside one megatron world (``dp_size * pp_size * tp_size`` worker processes).

megatron-core's ``initialize_model_parallel(tp, pp)`` over the whole world makes the rest of it
data parallel: each data-parallel group holds the ranks of one (tp rank, stage) across the dp
replicas. The driver splits every tenant's rows of a ``forward_backward_many`` over the dp
replicas (:mod:`twinkle.parallel._sharding`, pairs kept together for DPO); each replica runs its
rows through its tp x pp model, then each tenant's gradients are scaled by the replica's share
of that tenant's normaliser (tokens, rows, ... of the combined batch) and all-reduced over the
dp group: :class:`twinkle.parallel._worker.ReplicaWorker`'s synchronisation, reused as is, with
its collectives on megatron's dp group instead of the whole world. Every replica then holds the
same gradients, so clipping and the Adam step agree over dp (each replica's tp group shards its
moments); other calls (``forward_only``, the
``forward``/``backward`` path, optimizer steps, checkpoints) run the same request on every
replica, which gives every replica the same result.

Expert parallel (``ep_size`` E, tp = pp = 1) is the same world: megatron's expert groups are
carved out of its E data-parallel ranks, so each rank runs its share of the rows and the MoE
layers' all-to-all moves every token to the rank of its experts and back. The adapters are all
dense (attention, ``lm_head``: experts and router carry none, see
:func:`~twinkle.model.megatron._moe.check_adapter_targets`), so every adapter gradient is the
dp all-reduce's; megatron's expert weights (``allreduce = False``, its mark for "reduce over the
expert-data-parallel group only", a group of 1 here) are frozen and take no gradient at all.
The all-to-alls pair up across ranks, so every rank must run the same passes:
:class:`ExpertRanksSync` checks each rank's rows before any rank starts (a rank that failed
alone would leave its peers waiting in an all-to-all), makes every rank run a reference pass
when one does, agrees again before the backward (a loss that failed on one rank's rows stops
every rank), and each rank runs its rows as one pass.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from twinkle.parallel import _normalisation, _sharding
from twinkle.parallel import _worker as replica_worker


class _OnGroup:
    """``torch.distributed`` whose ``all_reduce`` runs on ``group`` (megatron's dp group)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, **kwargs):
        return dist.all_reduce(tensor, op=op, group=self.group)

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)


class _WithReference(_normalisation.RecordingLoss):
    """A rank's loss made to ask for the reference pass (a bare forward) its peers run: the
    pass's MoE all-to-alls must pair up. The loss itself ignores the reference log-probs."""

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return True


class ExpertRanksSync(replica_worker.ReplicaWorker):
    """The dp synchronisation of an expert-parallel rank. Before the pass the ranks agree (one
    all-reduce over the dp group) that each one's rows collate, so either all run the pass,
    whose MoE all-to-alls pair up, or none does; and on whether any runs a reference pass (a
    DPO or KL loss's bare forward), which the others then run too."""

    def forward_backward_many(self, shards: dict[str, Any], order: list[str]) -> dict[str, Any]:
        error: BaseException | None = None
        reference = False
        try:
            for name, request in shards.items():
                if request is not None:
                    request = dict(request)
                    tenant = self.model.tenant(name)
                    batch = self.model._collate(tenant, request.pop("inputs"), request)
                    loss = batch.loss or tenant.loss
                    reference |= bool(getattr(loss, "needs_reference", False))
        except Exception as exc:
            error = exc
        flags = self._sum_over_ranks([float(error is not None), float(reference)])
        if error is not None:
            raise error
        if float(flags[0]) > 0:
            raise replica_worker.PeerFailedError(
                f"rank {self.rank}: another expert rank's rows were refused; nothing ran"
            )
        if float(flags[1]) > 0 and not reference:
            shards = _ask_reference(self.model, shards)
        # A failure after the pass's forward (a non-finite loss on this rank's rows alone)
        # must stop every rank before its backward, whose all-to-alls would wait for this one.
        self.model._pass_agreement = self._agree_before_backward
        try:
            return super().forward_backward_many(shards, order)
        finally:
            self.model._pass_agreement = None
            self.model.expert_token_scales.by_tenant = None
            self._prescaled = set()
            self._call = None

    def _synchronised(self, order, present, run, losses=None):
        # What the agreement before the backward needs to weigh the experts' tokens.
        self._call = (order, present, self._call_losses(order, losses))
        return super()._synchronised(order, present, run, losses)

    def _prescaled_params(self) -> set[int]:
        return getattr(self, "_prescaled", set())

    def _sum_over_ranks(self, values: list[float]):
        """``values`` summed over the expert ranks (one all-reduce over the dp group)."""
        import torch

        flags = torch.tensor(values, device=self.model.device)
        replica_worker.dist.all_reduce(flags)
        return flags

    def _agree_before_backward(self, failure: BaseException | None) -> None:
        """One flag all-reduce over the expert ranks: raise this rank's failure, or a
        ``PeerFailedError`` when another rank failed; nothing is backpropagated anywhere."""
        flag = self._sum_over_ranks([float(failure is not None)])
        if failure is not None:
            raise failure
        if float(flag[0]) > 0:
            raise replica_worker.PeerFailedError(
                f"rank {self.rank}: another expert rank's loss failed before the backward; "
                "nothing was applied"
            )
        self._agree_expert_scales()

    def _agree_expert_scales(self) -> None:
        """Every rank's gradient scale for each tenant of the call (one all-reduce of the
        ranks' loss statistics), for the expert adapters' per-token weighting (see
        :mod:`._moe_lora`); those adapters then skip the scale after the backward. Nothing to
        do while no tenant has an expert adapter (the same answer on every rank)."""
        import torch
        from megatron.core import parallel_state as ps

        order, present, losses = self._call
        tenants = [self.model.tenant(name) for name in order]
        experts = [self.model.expert_parameters(t.name) for t in tenants]
        if not any(experts):
            return
        world, rank = self.world_size, ps.get_expert_model_parallel_rank()
        table = torch.zeros(world, len(tenants), 4, dtype=torch.float64)
        for i, tenant in enumerate(tenants):
            stat = self._stats(tenant, present, present, losses[tenant.name])
            table[rank, i] = torch.tensor([stat.norm, stat.rows, stat.seq, stat.tokens])
        table = table.to(self.model.device)
        replica_worker.dist.all_reduce(table)
        table = table.cpu()
        scales = {}
        for i, tenant in enumerate(tenants):
            kind = _normalisation.normaliser_kind(losses[tenant.name])
            col = table[:, i]
            total = _normalisation.global_norm(
                kind, float(col[:, 0].sum()), int(col[:, 1].sum()), int(col[:, 2].max())
            )
            scales[tenant.name] = torch.tensor(
                [
                    _normalisation.scale(
                        kind,
                        _normalisation.ShardStats(float(n), int(r), int(q), int(k)),
                        total,
                    )
                    for n, r, q, k in col.tolist()
                ]
            )
        self.model.expert_token_scales.by_tenant = scales
        self._prescaled = {id(p) for params in experts for p in params}


def _ask_reference(model: Any, shards: dict[str, Any]) -> dict[str, Any]:
    """``shards`` with its first tenant's loss (the request's or the tenant's) asking for the
    reference pass; its value, gradient and normaliser stay that loss's."""
    from twinkle.loss import loss_from_spec

    name = next(n for n, request in shards.items() if request is not None)
    request = dict(shards[name])
    if request.get("loss") is not None:
        inner = loss_from_spec(request["loss"])
    else:
        inner = model.tenant(name).loss
    inner = inner.inner if isinstance(inner, _normalisation.RecordingLoss) else inner
    request["loss"] = _WithReference(inner)
    return {**shards, name: request}


def replica_sync(model: Any, dp_rank: int, dp_size: int) -> Any:
    """A ``ReplicaWorker`` around this rank's ``model`` whose gradient synchronisation runs on
    megatron's data-parallel group (this worker process holds one model: the module's ``dist``
    is replaced for the process); under expert parallel an :class:`ExpertRanksSync`."""
    from megatron.core import parallel_state as ps

    replica_worker.dist = _OnGroup(ps.get_data_parallel_group())
    expert = ps.get_expert_model_parallel_world_size() > 1
    cls = ExpertRanksSync if expert else replica_worker.ReplicaWorker
    sync = cls.__new__(cls)
    sync.rank, sync.world_size, sync.model = dp_rank, dp_size, model
    sync.device = str(model.device)
    return sync


def empty_share(shards: list[dict[str, Any]]) -> bool:
    """Some rank would get no rows at all (fewer rows than ranks): under expert parallel it
    could not take part in the all-to-alls, so the call runs whole on every rank instead."""
    return any(all(request is None for request in shard.values()) for shard in shards)


def _paired(name: str, request: dict[str, Any], pair_rows: set[str]) -> bool:
    """The request's rows are (chosen, rejected) pairs: its tenant's loss is DPO (``pair_rows``)
    or its own loss is."""
    if name in pair_rows:
        return True
    spec = request.get("loss")
    if spec is None:
        return False
    from twinkle.loss import loss_from_spec

    try:
        return _normalisation._loss_name(loss_from_spec(spec)) == "DPOLoss"
    except Exception:  # a bad spec: the ranks' collation refuses it, naming it
        return False


def odd_pairs(requests: dict[str, dict[str, Any]], pair_rows: set[str]) -> bool:
    """A paired request has an odd row count: split, the leftover row would make one rank's
    loss refuse its rows after its forward, while its peers wait in the backward's all-to-alls;
    run whole on every rank, all of them refuse it the same way."""
    return any(
        _paired(name, request, pair_rows) and _sharding.row_count(request["inputs"]) % 2
        for name, request in requests.items()
    )


def split_requests(
    requests: dict[str, dict[str, Any]], dp_size: int, pair_rows: set[str]
) -> tuple[list[str], list[dict[str, Any]]]:
    """The tenants' order and each dp replica's ``{tenant: its rows' request or None}``."""
    order = list(requests)
    split = {}
    for name, request in requests.items():
        rows = _sharding.row_count(request["inputs"])
        unit = 2 if _paired(name, request, pair_rows) else 1
        split[name] = _sharding.split_request(
            dict(request), _sharding.shard_bounds(rows, dp_size, unit)
        )
    return order, [{name: split[name][d] for name in order} for d in range(dp_size)]


def join(order: list[str], results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The replicas' results (in dp order = row order) as each tenant's one result."""
    return {name: _sharding.join_results(name, results) for name in order}


__all__ = [
    "ExpertRanksSync",
    "empty_share",
    "join",
    "odd_pairs",
    "replica_sync",
    "split_requests",
]
