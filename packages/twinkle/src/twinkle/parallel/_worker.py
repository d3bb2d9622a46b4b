"""One data-parallel rank: a ``MultiLoraTransformersModel`` replica in a Ray actor process.

``forward_backward_many`` runs the rank's rows, then the ranks agree (one small all-reduce) on
whether every rank succeeded and on each tenant's normaliser, scale their gradients by
``n_r / N`` and all-reduce the sum; optimizer steps then run identically on every rank.
"""

from __future__ import annotations

import copy
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from twinkle.loss import loss_from_spec
from twinkle.parallel import _normalisation as norm


class PeerFailedError(RuntimeError):
    """Another rank failed this collective step; every rank rolled back."""


class ReplicaWorker:
    """The Ray actor body (wrapped with ``ray.remote`` by ``DataParallelModel``)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        model_id: str,
        device_type: str,
        threads: int | None,
        model_kwargs: dict[str, Any],
    ) -> None:
        from twinkle.model import MultiLoraTransformersModel

        if threads:
            torch.set_num_threads(threads)
        self.rank, self.world_size = rank, world_size
        from twinkle.parallel.placement import compute_device

        device = model_kwargs.pop("device", None) or compute_device(device_type)
        self.device = device
        self.model: Any = None
        if model_kwargs.pop("model_backend", "transformers") == "megatron":
            # Built once the process group exists: megatron-core's parallel state (tp = pp = 1,
            # its dp group = these replicas) lives on that group, not on a one-process world.
            self._build = lambda: _megatron_model(model_id, device, model_kwargs)
        else:
            self.model = MultiLoraTransformersModel(model_id, device=device, **model_kwargs)

    # ------------------------------------------------------------------ setup
    def compute_device(self) -> str:
        return self.device

    def placement(self) -> dict[str, Any]:
        from twinkle.parallel.placement import placement_report

        return {"rank": self.rank, **placement_report(self.device)}

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a free port on it, for rank 0 to host the process group."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind((ip, 0))
            return ip, sock.getsockname()[1]

    def init_process_group(self, host: str, port: int, backend: str, timeout_s: float) -> None:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        if self.model is None:
            self.model = self._build()

    # ------------------------------------------------------------------ plain calls
    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.model, method)(*args, **kwargs)
        self._wrap_losses()
        return result

    def apply(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(model, *args)`` here (inspection in tests and debugging)."""
        return fn(self.model, *args)

    def _wrap_losses(self) -> None:
        for tenant in self.model.tenants.values():
            if tenant.loss is not None and not isinstance(tenant.loss, norm.RecordingLoss):
                tenant.loss = norm.RecordingLoss(tenant.loss)

    def checksums(self, names: list[str]) -> dict[str, tuple[float, float]]:
        """Per adapter: a float64 sum of its weights and of its optimizer state."""
        out = {}
        for name in names:
            tenant = self.model.tenants[name]
            weights = sum(
                float(p.detach().double().abs().sum()) + float(p.detach().double().sum())
                for p in tenant.params
            )
            state = 0.0
            if tenant.optimizer is not None:
                for value in tenant.optimizer.state.values():
                    state += sum(
                        float(v.double().sum()) for v in value.values() if torch.is_tensor(v)
                    )
            out[name] = (weights, state)
        return out

    def clip_grad_and_step(
        self, max_grad_norm: float, adapter_name: str | None
    ) -> tuple[bool, dict]:
        stepped = self.model.clip_grad_and_step(max_grad_norm, adapter_name=adapter_name)
        name = self.model.tenant(adapter_name).name
        return stepped, self.checksums([name]) if stepped else {}

    def optim_step(self, adam_params: Any, adapter_name: str) -> tuple[dict, dict]:
        metrics = self.model.optim_step(adam_params, adapter_name=adapter_name)
        return metrics, self.checksums([adapter_name])

    # ------------------------------------------------------------------ training
    def forward_backward_many(
        self, shards: dict[str, dict[str, Any] | None], order: list[str]
    ) -> dict[str, Any]:
        """Run this rank's rows of each tenant, then synchronise gradients over all ranks."""
        present = {k: v for k, v in shards.items() if v is not None}
        losses: dict[str, Any] = {}
        for name, request in present.items():
            if request.get("loss") is not None:
                # A per-request loss (Tinker's loss_fn) is recorded like the tenant's own, so its
                # shard statistics scale the gradients before the all-reduce.
                losses[name] = norm.RecordingLoss(loss_from_spec(request["loss"]))
                present[name] = {**request, "loss": losses[name]}
            else:
                losses[name] = self.model.tenant(name).loss
                if isinstance(losses[name], norm.RecordingLoss):
                    losses[name].last = None
        return self._synchronised(
            order,
            present,
            lambda: self.model.forward_backward_many(present) if present else {},
            losses,
        )

    def calculate_loss(self, adapter_name: str, **kwargs: Any) -> tuple[float, tuple, str]:
        """This rank's loss, its ``ShardStats`` and the loss's normaliser kind."""
        loss = self.call("calculate_loss", adapter_name=adapter_name, **kwargs)
        recording = self.model.tenant(adapter_name).loss
        stats = recording.last or norm.ShardStats()
        return (
            loss,
            (stats.norm, stats.rows, stats.seq, stats.tokens),
            norm.normaliser_kind(recording),
        )

    def backward(self, adapter_name: str, has_rows: bool) -> dict[str, Any]:
        """The ``forward`` + ``calculate_loss`` + ``backward`` path, synchronised like the above."""
        tenant = self.model.tenant(adapter_name)
        present = {tenant.name: None} if has_rows else {}

        def run() -> dict[str, Any]:
            if not has_rows:
                return {}
            state = tenant.last_forward
            loss = (
                state.loss_output.loss
                if state is not None and state.loss_output is not None
                else None
            )
            self.model.backward(adapter_name=tenant.name)  # raises without forward + calculate_loss
            return {tenant.name: {"loss": float(loss.detach())}}

        return self._synchronised([tenant.name], present, run)

    def _synchronised(
        self,
        order: list[str],
        present: dict[str, Any],
        run: Callable[[], dict],
        losses: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run ``run`` (this rank's passes), then reduce every tenant's gradients over the ranks.

        ``losses``: the loss each tenant's rows used in this pass, when it is not the tenant's
        own (a per-request loss).
        """
        losses = self._call_losses(order, losses)
        tenants = [self.model.tenant(name) for name in order]
        snapshots = [_snapshot(t) for t in tenants]
        for tenant in tenants:
            for param in tenant.params:
                param.grad = None
        error: BaseException | None = None
        results: dict[str, Any] = {}
        try:
            results = run()
        except Exception as exc:  # every rank must still reach the collective below
            error = exc
        stats = [self._stats(t, present, results, losses[t.name]) for t in tenants]
        rows = []
        for tenant, snapshot, stat in zip(tenants, snapshots, stats):
            loss = results.get(tenant.name, {}).get("loss", 0.0) if stat.rows else 0.0
            correct = tenant.train_metrics.correct - snapshot["metrics"].correct if stat.rows else 0
            rows.append(
                [
                    float(error is not None),
                    stat.norm,
                    stat.rows,
                    stat.tokens,
                    stat.norm * loss,
                    correct,
                ]
            )
        device = self.model.device
        sums = torch.tensor(rows, dtype=torch.float64, device=device)
        seqs = torch.tensor([s.seq for s in stats], dtype=torch.float64, device=device)
        dist.all_reduce(sums)
        dist.all_reduce(seqs, op=dist.ReduceOp.MAX)
        sums, seqs = sums.cpu(), seqs.cpu()
        if sums[:, 0].sum() > 0:
            for tenant, snapshot in zip(tenants, snapshots):
                _restore(tenant, snapshot)
            if error is not None:
                raise error
            raise PeerFailedError(
                f"rank {self.rank}: another rank failed this step; gradients rolled back"
            )
        return self._reduce_gradients(tenants, snapshots, stats, sums, seqs, results, losses)

    def _call_losses(self, order: list[str], losses: dict[str, Any] | None) -> dict[str, Any]:
        """Each tenant's loss in this call: the request's (``losses``) or the tenant's own."""
        return {name: (losses or {}).get(name) or self.model.tenant(name).loss for name in order}

    def _prescaled_params(self) -> set[int]:
        """Ids of parameters whose gradients this call already scaled during the backward
        (none here; expert parallel's expert adapters, see ``ExpertRanksSync``)."""
        return set()

    def _stats(
        self, tenant, present: dict[str, Any], results: dict[str, Any], loss: Any
    ) -> norm.ShardStats:
        if tenant.name not in present or tenant.name not in results:
            return norm.ShardStats()
        recorded = loss.last if isinstance(loss, norm.RecordingLoss) else None
        return recorded or norm.ShardStats()

    def _reduce_gradients(
        self, tenants, snapshots, stats, sums, seqs, results, losses
    ) -> dict[str, Any]:
        scales, totals = [], []
        for i, tenant in enumerate(tenants):
            kind = norm.normaliser_kind(losses[tenant.name])
            total = norm.global_norm(kind, float(sums[i, 1]), int(sums[i, 2]), int(seqs[i]))
            scales.append(norm.scale(kind, stats[i], total))
            totals.append(total)
        done = self._prescaled_params()
        flat = torch.cat([
            (p.grad.detach().float() * (1.0 if id(p) in done else scale) if p.grad is not None else torch.zeros(p.numel(), device=p.device)).reshape(-1)
            for tenant, scale in zip(tenants, scales) for p in tenant.params
        ])  # fmt: skip
        dist.all_reduce(flat)
        offset = 0
        out: dict[str, Any] = {}
        for i, (tenant, snapshot) in enumerate(zip(tenants, snapshots)):
            for param, previous in zip(tenant.params, snapshot["grads"]):
                grad = flat[offset : offset + param.numel()].view_as(param).to(param.dtype)
                offset += param.numel()
                param.grad = grad if previous is None else previous + grad
            global_loss = float(sums[i, 4]) / totals[i] if totals[i] > 0 else 0.0
            _record_global(
                tenant,
                snapshot,
                stats[i],
                int(sums[i, 2]),
                int(sums[i, 3]),
                int(sums[i, 5]),
                global_loss,
            )
            out[tenant.name] = {
                **results.get(tenant.name, {}),
                "scale": scales[i],
                "global_loss": global_loss,
            }
        return out


def _megatron_model(model_id: str, device: str, model_kwargs: dict[str, Any]) -> Any:
    from twinkle.model.megatron import MultiLoraMegatronModel

    return MultiLoraMegatronModel(model_id, device=device, **model_kwargs)


def _snapshot(tenant) -> dict[str, Any]:
    return {
        "grads": [p.grad for p in tenant.params],
        "pending": tenant.pending_grads,
        "consumed": tenant.consumed_train_samples,
        "metrics": copy.deepcopy(tenant.train_metrics),
    }


def _restore(tenant, snapshot: dict[str, Any]) -> None:
    for param, grad in zip(tenant.params, snapshot["grads"]):
        param.grad = grad
    tenant.pending_grads = snapshot["pending"]
    tenant.consumed_train_samples = snapshot["consumed"]
    tenant.train_metrics = snapshot["metrics"]
    tenant.last_forward = None


def _record_global(
    tenant, snapshot, local: norm.ShardStats, rows: int, tokens: int, correct: int, loss: float
) -> None:
    """Every rank records the combined batch (not its shard): identical progress and metrics."""
    extra = dict(tenant.train_metrics.extra) if local.rows else dict(snapshot["metrics"].extra)
    tenant.train_metrics = snapshot["metrics"]
    tenant.train_metrics.add(loss, correct, tokens, extra)
    tenant.pending_grads = True
    tenant.consumed_train_samples = snapshot["consumed"] + rows


__all__ = ["PeerFailedError", "ReplicaWorker"]
