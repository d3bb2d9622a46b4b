"""Adam with each tenant's moments sharded over the tensor-parallel group (tp > 1).

Under tp every rank holds a tenant's whole A and B and, after backward, their whole gradients
(:mod:`~twinkle.model.megatron._tp_lora` all-gathers the sliced ones), so clipping is the same on
every rank. Only the optimizer state is split, the way megatron's distributed optimizer splits
its own over data-parallel ranks: the tenant's parameters, flattened in order, are cut into
``tp`` equal contiguous chunks (the last one shorter); rank ``i`` keeps ``exp_avg`` and
``exp_avg_sq`` for chunk ``i`` alone, updates that chunk, and one all-gather of the updated
chunks gives every rank the whole new adapter. Adam is elementwise, so the update of a chunk is
exactly the one-process update of those elements.

Per-rank Adam memory is therefore ``2 * numel / tp`` (plus one step count) instead of
``2 * numel``; the price is one all-gather of the adapter's weights per step, the same bytes as
the gradient all-gather backward already does.

``state_dict()`` answers the one-process format (one entry per parameter, whole moments), so a
checkpoint written under tp loads into any backend and any tp size; it is a collective: every
rank of the tp group must call it (``save`` runs on every rank under tp for that reason, each
entering :meth:`gathered` first).
``load_state_dict`` takes that format and keeps this rank's chunk.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.distributed as dist

_MOMENTS = ("exp_avg", "exp_avg_sq")


class _TpShardedAdamMixin:
    """The sharding over a torch Adam/AdamW (``super()``) that sees one parameter: the chunk."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        from megatron.core import parallel_state as ps

        self.full_params: list[torch.nn.Parameter] = list(params)
        if not self.full_params:
            raise ValueError("an optimizer needs at least one parameter")
        self._group = ps.get_tensor_model_parallel_group()
        self._world = dist.get_world_size(self._group)
        rank = dist.get_rank(self._group)
        self.numel = sum(p.numel() for p in self.full_params)
        self.chunk = math.ceil(self.numel / self._world)
        self.lo = min(self.numel, rank * self.chunk)
        self.hi = min(self.numel, self.lo + self.chunk)
        with torch.no_grad():
            shard = self._flat(p.detach() for p in self.full_params)[self.lo : self.hi].clone()
        self.shard = torch.nn.Parameter(shard)
        super().__init__([self.shard], **kwargs)  # type: ignore[call-arg]

    @staticmethod
    def _flat(tensors) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors])

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        """Every rank's chunk of a flat tensor, concatenated (``numel`` elements)."""
        padded = local.new_zeros(self.chunk)
        padded[: local.numel()] = local
        parts = [torch.empty_like(padded) for _ in range(self._world)]
        dist.all_gather(parts, padded, group=self._group)
        return torch.cat(parts)[: self.numel]

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        out, at = [], 0
        for p in self.full_params:
            out.append(flat[at : at + p.numel()].view_as(p))
            at += p.numel()
        return out

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Update this rank's chunk from the whole gradients, then all-gather the weights.

        A parameter without a gradient counts as a zero gradient (the flat gradient buffers
        make every weight of a tenant step together anyway)."""
        if closure is not None:
            raise ValueError("the tensor-parallel Adam takes no closure")
        grads = self._flat(
            p.grad if p.grad is not None else torch.zeros_like(p) for p in self.full_params
        )
        # The weights may have changed outside the optimizer (a load, a resume): start from them.
        self.shard.copy_(self._flat(p.detach() for p in self.full_params)[self.lo : self.hi])
        self.shard.grad = grads[self.lo : self.hi].clone()
        super().step()  # type: ignore[misc]
        self.shard.grad = None
        for p, value in zip(self.full_params, self._views(self._gather(self.shard.detach()))):
            p.copy_(value)
        return None

    @contextlib.contextmanager
    def gathered(self):
        """Gather the whole state now (a collective every tp rank enters at the same point);
        ``state_dict()`` answers it without communicating until the block ends. A save takes
        it before its checks, so a refused save fails on every rank alike, none left waiting
        in the gather."""
        self._gathered = self.state_dict()
        try:
            yield self._gathered
        finally:
            self._gathered = None

    def state_dict(self) -> dict[str, Any]:
        """The one-process state dict (whole moments per parameter); a tp-group collective."""
        if getattr(self, "_gathered", None) is not None:
            return self._gathered
        mine = super().state_dict()  # type: ignore[misc]
        group = {k: v for k, v in mine["param_groups"][0].items() if k != "params"}
        entry = mine["state"].get(0)
        # Every rank has stepped the same number of times, so all have state or none has.
        state: dict[int, dict[str, Any]] = {}
        if entry:
            whole = {m: self._views(self._gather(entry[m])) for m in _MOMENTS}
            for i in range(len(self.full_params)):
                state[i] = {"step": entry["step"].clone()} | {
                    m: whole[m][i].clone() for m in _MOMENTS
                }
        params = list(range(len(self.full_params)))
        return {"state": state, "param_groups": [group | {"params": params}]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep this rank's chunk of a one-process state dict (any tp size wrote it)."""
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.full_params):
            raise ValueError(
                f"optimizer state has {sum(len(g['params']) for g in groups)} parameters in "
                f"{len(groups)} groups; this adapter has {len(self.full_params)} in one"
            )
        group = {k: v for k, v in groups[0].items() if k != "params"} | {"params": [0]}
        entries = [state_dict["state"].get(i) for i in groups[0]["params"]]
        if not any(entries):
            super().load_state_dict({"state": {}, "param_groups": [group]})  # type: ignore[misc]
            return
        steps = {float(e["step"]) for e in entries if e}
        if (
            None in entries
            or len(steps) != 1
            or any(set(e) != {"step", *_MOMENTS} for e in entries)
        ):
            raise ValueError(
                "optimizer state cannot be sharded over tensor-parallel ranks: its parameters "
                "have unequal step counts or extra moments (amsgrad)"
            )
        chunk = {m: self._flat(e[m] for e in entries)[self.lo : self.hi].clone() for m in _MOMENTS}
        entry = {"step": entries[0]["step"]} | chunk
        super().load_state_dict({"state": {0: entry}, "param_groups": [group]})  # type: ignore[misc]


class TpShardedAdam(_TpShardedAdamMixin, torch.optim.Adam):
    """``torch.optim.Adam`` with its moments sharded over the tensor-parallel group."""


class TpShardedAdamW(_TpShardedAdamMixin, torch.optim.AdamW):
    """``torch.optim.AdamW`` with its moments sharded over the tensor-parallel group."""


#: The sharded class of each Adam-family name the megatron backend accepts.
SHARDED = {"Adam": TpShardedAdam, "AdamW": TpShardedAdamW}

__all__ = ["SHARDED", "TpShardedAdam", "TpShardedAdamW"]
