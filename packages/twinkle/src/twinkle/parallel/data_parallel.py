"""``DataParallelModel``: the multi-LoRA model's API over ``dp_size`` replicas in Ray actors.

Every batch (one tenant's, or a fused multi-tenant one) is split by rows across the replicas; each
runs forward/backward on its rows; gradients are scaled by each rank's share of the loss's
normaliser and all-reduced (gloo on CPU, nccl on GPU), so a step equals one replica's step on the
combined batch (see ``twinkle.parallel._normalisation``). Optimizer steps then run on every rank
with the same gradients: states stay identical, which each step verifies by checksum. Checkpoints
are written by rank 0 only; loads and resumes run on every rank (paths must be shared).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinkle.env import TWINKLE_OUTPUT_DIR
from twinkle.errors import InvalidArgumentError, StateOrderError, UnknownAdapterError
from twinkle.loss.registry import loss_class
from twinkle.model.metrics import Metric
from twinkle.model.protocol import AdamParams, Capabilities
from twinkle.model.protocol import adam_params as adam_params_of
from twinkle.parallel import _sharding
from twinkle.parallel._replicas import ReplicaSet, placement_options
from twinkle.parallel.device import DeviceGroup
from twinkle.parallel.errors import AdapterLostError
from twinkle_client.types import ForwardOutput

_CONFIG_CALLS = ("set_template", "set_processor", "set_loss", "set_optimizer", "set_lr_scheduler")


@dataclass
class _Adapter:
    """What the driver remembers to rebuild an adapter on fresh replicas."""

    name: str
    calls: dict[str, tuple[tuple, dict]] = field(default_factory=dict)
    checkpoint: tuple[str, bool] | None = None  # (path, resumable)
    lost: str | None = None
    pair_rows: bool = False


class DataParallelModel:
    """``MultiLoraTransformersModel`` with ``dp_size`` data-parallel replicas (Ray actors).

    Args:
        model_id: As for ``MultiLoraTransformersModel``.
        dp_size: Number of replicas (ranks).
        device_type: ``cpu`` or ``cuda`` (one GPU per rank).
        backend: ``torch.distributed`` backend; default gloo on CPU, nccl on CUDA.
        device_group: A ``DeviceGroup`` (or its name in ``twinkle.initialize(mode='ray')``) whose
            placement group, CPUs and custom resources the ranks use.
        num_cpus: CPUs each rank reserves (default: the group's, else 1).
        resources: Custom Ray resources each rank needs (node labels).
        num_gpus: GPUs each rank reserves (default: 1 for ``cuda``, 0 for ``cpu``).
        nproc_per_node: Pack this many ranks on each node (one STRICT_PACK placement group per
            node), as the server's ``nproc_per_node``; default: Ray places each rank freely.
        timeout_s: Collective timeout.
        start_timeout_s: How long the replicas may take to schedule and start.
        **model_kwargs: Passed to each replica's model (``torch_dtype``, ``seed``, ...).

    Raises:
        RuntimeError: Ray is not installed or not initialised.
    """

    # Fused passes run on every replica; optimizer steps run per tenant (each checked by checksum).
    # Adapters live in the worker processes: rank 0's state is handed over, a new one broadcast;
    # no paging, and no tenant in this process.
    capabilities = Capabilities(fused_forward_backward=True, adapter_state_io=True)

    def __init__(
        self,
        model_id: str,
        dp_size: int,
        device_type: str = "cpu",
        backend: str | None = None,
        *,
        device_group: DeviceGroup | str | None = None,
        num_cpus: float | None = None,
        resources: dict[str, float] | None = None,
        num_gpus: float | None = None,
        nproc_per_node: int | None = None,
        timeout_s: float = 1800.0,
        start_timeout_s: float = 600.0,
        **model_kwargs: Any,
    ) -> None:
        import ray

        if dp_size < 1:
            raise InvalidArgumentError(f"dp_size must be >= 1, got {dp_size}")
        if not ray.is_initialized():
            raise RuntimeError(
                "DataParallelModel needs Ray: call twinkle.initialize(mode='ray') first"
            )
        self.model_id, self.dp_size = model_id, dp_size
        self.device_type = device_type.lower()
        self._backend = backend
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.model_kwargs = model_kwargs
        group, self._placement_group = _resolve_group(device_group)
        self.num_cpus = (
            num_cpus if num_cpus is not None else (group.cpus_per_rank if group else 1.0)
        )
        self.resources = (
            resources if resources is not None else (dict(group.resources or {}) if group else {})
        )
        self.num_gpus = (
            num_gpus if num_gpus is not None else (1 if self.device_type == "cuda" else 0)
        )
        self._packing = None
        if nproc_per_node and self._placement_group is None:
            from twinkle.parallel.placement import NodePacking, rank_bundle

            bundle = rank_bundle(self.num_cpus, self.num_gpus, self.resources)
            self._packing = NodePacking(dp_size, nproc_per_node, bundle, start_timeout_s)
        self.adapters: dict[str, _Adapter] = {}
        self._forward_ranks: dict[str, list[int]] = {}
        self.replicas = ReplicaSet(self._start_worker, dp_size)
        self._init_process_group()

    # ------------------------------------------------------------------ replicas
    def _start_worker(self, rank: int) -> Any:
        import ray

        from twinkle.parallel._worker import ReplicaWorker

        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_restarts": 0}
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        if self.resources:
            options["resources"] = dict(self.resources)
        if self._packing is not None:
            options.update(self._packing.options(rank))
        else:
            options.update(placement_options(self._placement_group, rank))
        threads = max(1, int(self.num_cpus)) if self.device_type == "cpu" else None
        return (
            ray.remote(ReplicaWorker)
            .options(**options)
            .remote(
                rank,
                self.dp_size,
                self.model_id,
                self.device_type,
                threads,
                dict(self.model_kwargs),
            )
        )

    @property
    def backend(self) -> str:
        """The ``torch.distributed`` backend: as given, else nccl where ranks compute on CUDA."""
        if self._backend is None:
            ((device,),) = [self.replicas.call("compute_device", ranks=[0])]
            self._backend = "nccl" if device == "cuda" else "gloo"
        return self._backend

    def placements(self) -> list[dict[str, Any]]:
        """Each rank's node id, assigned resources, ``CUDA_VISIBLE_DEVICES`` and device."""
        return self.replicas.call("placement")

    def _init_process_group(self) -> None:
        ((host, port),) = self.replicas.call(
            "rendezvous_address", ranks=[0], timeout_s=self.start_timeout_s
        )
        self.replicas.call(
            "init_process_group",
            host,
            port,
            self.backend,
            self.timeout_s,
            timeout_s=self.start_timeout_s,
        )

    def node_ids(self) -> list[str]:
        """The Ray node id of each rank."""
        return self.replicas.call("node_id")

    def recover(self) -> dict[str, Any]:
        """Restart every replica and rebuild the adapters after a ``WorkerLostError``.

        Each adapter is re-created with its configuration and reloaded from its last checkpoint
        (``save``/``load``/``resume_from_checkpoint`` path; resumed with optimizer state when saved
        with it). Adapters without a checkpoint are reported lost: they raise ``AdapterLostError``
        until re-added or resumed.

        Returns:
            ``{'reloaded': {adapter: path}, 'lost': {adapter: why}}``.
        """
        rank = self.replicas.lost.rank if self.replicas.lost is not None else None
        self.replicas.restart()
        self._init_process_group()
        reloaded, lost = {}, {}
        for adapter in self.adapters.values():
            if adapter.lost is not None:
                lost[adapter.name] = adapter.lost
            elif adapter.checkpoint is None:
                adapter.lost = f"its state died with worker rank {rank} and it has no checkpoint"
                lost[adapter.name] = adapter.lost
            else:
                self._rebuild(adapter)
                reloaded[adapter.name] = adapter.checkpoint[0]
        return {"reloaded": reloaded, "lost": lost}

    def _rebuild(self, adapter: _Adapter, checkpoint: tuple[str, bool] | None = None) -> Any:
        """Re-create ``adapter`` on every replica from its configuration and a checkpoint."""
        if adapter.name in self.replicas.call("call", "list_adapters")[0]:
            self.replicas.call("call", "remove_adapter", adapter_name=adapter.name)
        for method, (args, kwargs) in adapter.calls.items():
            self.replicas.call("call", method, *args, **kwargs)
        path, resumable = checkpoint or adapter.checkpoint
        method = "resume_from_checkpoint" if resumable else "load"
        result = self.replicas.call("call", method, path, adapter_name=adapter.name)[0]
        adapter.lost = None
        adapter.checkpoint = (path, resumable)
        return result

    def shutdown(self) -> None:
        """Stop the replicas and release their node reservations."""
        self.replicas.kill()
        if self._packing is not None:
            self._packing.remove()

    # ------------------------------------------------------------------ adapters
    def _adapter(self, adapter_name: str | None) -> _Adapter:
        if adapter_name is None:
            if len(self.adapters) == 1:
                adapter = next(iter(self.adapters.values()))
            elif not self.adapters:
                raise UnknownAdapterError(
                    "no adapter on this model: call add_adapter_to_model first"
                )
            else:
                raise InvalidArgumentError(
                    f"several adapters exist ({', '.join(self.adapters)}): pass adapter_name="
                )
        elif adapter_name not in self.adapters:
            raise UnknownAdapterError(
                f"unknown adapter {adapter_name!r}; adapters on this model: {', '.join(self.adapters) or 'none'}"
            )
        else:
            adapter = self.adapters[adapter_name]
        if adapter.lost is not None:
            raise AdapterLostError(
                f"adapter {adapter.name!r} is lost ({adapter.lost}): add it again (remove_adapter + "
                "add_adapter_to_model) or restore it with resume_from_checkpoint / load"
            )
        return adapter

    def _broadcast(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.replicas.call("call", method, *args, **kwargs)[0]

    def add_adapter_to_model(
        self,
        adapter_name: str,
        config: Any = None,
        gradient_accumulation_steps: int = 1,
        **kwargs: Any,
    ) -> None:
        """Create tenant ``adapter_name`` on every replica (same seed: identical initial weights)."""
        if adapter_name in self.adapters and self.adapters[adapter_name].lost is None:
            raise InvalidArgumentError(f"adapter {adapter_name!r} already exists on this model")
        if adapter_name in self.adapters:  # lost: its replicas hold nothing
            del self.adapters[adapter_name]
        self._broadcast(
            "add_adapter_to_model", adapter_name, config, gradient_accumulation_steps, **kwargs
        )
        adapter = _Adapter(adapter_name)
        adapter.calls["add_adapter_to_model"] = (
            (adapter_name, config, gradient_accumulation_steps),
            dict(kwargs),
        )
        self.adapters[adapter_name] = adapter

    def remove_adapter(self, adapter_name: str | None = None) -> None:
        name = adapter_name if adapter_name in self.adapters else self._adapter(adapter_name).name
        if self.adapters[name].lost is None:
            self._broadcast("remove_adapter", adapter_name=name)
        del self.adapters[name]

    def list_adapters(self) -> list[str]:
        return [name for name, adapter in self.adapters.items() if adapter.lost is None]

    def _configure(
        self, method: str, value: Any, adapter_name: str | None, kwargs: dict[str, Any]
    ) -> None:
        adapter = self._adapter(adapter_name)
        self._broadcast(method, value, adapter_name=adapter.name, **kwargs)
        adapter.calls[method] = ((value,), {"adapter_name": adapter.name, **kwargs})
        if method == "set_loss":
            cls = loss_class(value)
            adapter.pair_rows = bool(cls is not None and cls.pair_rows)

    def set_template(self, template: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._configure("set_template", template, adapter_name, kwargs)

    def set_processor(self, processor: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._configure("set_processor", processor, adapter_name, kwargs)

    def set_loss(self, loss: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._configure("set_loss", loss, adapter_name, kwargs)

    def set_optimizer(self, optimizer: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._configure("set_optimizer", optimizer, adapter_name, kwargs)

    def set_lr_scheduler(
        self, scheduler: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        self._configure("set_lr_scheduler", scheduler, adapter_name, kwargs)

    def get_train_configs(self, adapter_name: str | None = None) -> Any:
        name = self._adapter(adapter_name).name
        return self.replicas.call("call", "get_train_configs", adapter_name=name, ranks=[0])[0]

    # ------------------------------------------------------------------ training
    def _shards(self, name: str, request: dict[str, Any]) -> list[dict[str, Any] | None]:
        if "inputs" not in request:
            raise InvalidArgumentError(f"request for adapter {name!r} has no 'inputs'")
        rows = _sharding.row_count(request["inputs"])
        # Contrastive rows see each other (in-batch negatives): they stay on one replica.
        whole = request.get("task") == "embedding"
        unit = max(rows, 1) if whole else 2 if self.adapters[name].pair_rows else 1
        return _sharding.split_request(request, _sharding.shard_bounds(rows, self.dp_size, unit))

    def forward_backward(
        self, inputs: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """As ``MultiLoraTransformersModel.forward_backward``, rows split across the replicas."""
        name = self._adapter(adapter_name).name
        return self.forward_backward_many({name: {"inputs": inputs, **kwargs}})[name]

    def forward_backward_many(
        self, requests: dict[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        """One fused pass per replica over its rows of every tenant, then one gradient all-reduce."""
        if not requests:
            raise InvalidArgumentError("forward_backward_many needs at least one request")
        order = [self._adapter(name).name for name in requests]
        split = {name: self._shards(name, dict(request)) for name, request in requests.items()}
        per_rank = [
            (({name: split[name][rank] for name in order}, order), {})
            for rank in range(self.dp_size)
        ]
        results = self.replicas.gather(self.replicas.submit("forward_backward_many", per_rank))
        return {name: _sharding.join_results(name, results) for name in order}

    def forward_only(
        self, inputs: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Forward without gradients on every replica's rows; the loss is the row-weighted mean."""
        name = self._adapter(adapter_name).name
        shards = self._shards(name, {"inputs": inputs, **kwargs})
        ranks = [rank for rank, shard in enumerate(shards) if shard is not None]
        outs = self.replicas.gather([
            (rank, ref) for rank, ref in self.replicas.submit(
                "call", [(("forward_only", shard.pop("inputs")), {"adapter_name": name, **shard})
                         if shard else ((), {}) for shard in shards], ranks=ranks)
        ])  # fmt: skip
        rows = [len(out["logprobs"]) for out in outs]
        total = sum(rows) or 1
        result = ForwardOutput(
            logprobs=_sharding.join_logprobs([out["logprobs"] for out in outs]),
            num_tokens=sum(out["num_tokens"] for out in outs),
        )
        if all("loss" in out for out in outs):  # no loss for a disable_lora reference pass
            result["loss"] = sum(out["loss"] * r for out, r in zip(outs, rows)) / total
            result["metrics"] = _sharding.mean_metrics(
                [out.get("metrics", {}) for out in outs], rows
            )
        return result

    def forward(
        self, inputs: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Forward each replica's rows, keeping them for ``calculate_loss`` + ``backward``."""
        name = self._adapter(adapter_name).name
        shards = self._shards(name, {"inputs": inputs, **kwargs})
        ranks = [rank for rank, shard in enumerate(shards) if shard is not None]
        per_rank = [
            (("forward", s.pop("inputs")), {"adapter_name": name, **s}) if s else ((), {})
            for s in shards
        ]
        outs = self.replicas.gather(self.replicas.submit("call", per_rank, ranks=ranks))
        self._forward_ranks[name] = ranks
        return {
            "logprobs": _sharding.join_logprobs([o["logprobs"] for o in outs]),
            "num_tokens": sum(o["num_tokens"] for o in outs),
        }

    def calculate_loss(self, adapter_name: str | None = None, **kwargs: Any) -> float:
        """Each replica's loss on its rows, combined as the loss of the whole batch."""
        from twinkle.parallel import _normalisation as norm

        name = self._adapter(adapter_name).name
        ranks = self._forward_ranks.get(name)
        if not ranks:
            raise StateOrderError(f"adapter {name!r}: call forward before calculate_loss")
        outs = self.replicas.call("calculate_loss", name, ranks=ranks, **kwargs)
        kind = outs[0][2]
        stats = [norm.ShardStats(*s) for _, s, _ in outs]
        total = norm.global_norm(
            kind, sum(s.norm for s in stats), sum(s.rows for s in stats), max(s.seq for s in stats)
        )
        return sum(loss * norm.scale(kind, s, total) for (loss, _, _), s in zip(outs, stats))

    def backward(self, adapter_name: str | None = None) -> None:
        """Backpropagate on every replica and all-reduce the gradients."""
        name = self._adapter(adapter_name).name
        ranks = self._forward_ranks.pop(name, None)
        if not ranks:
            raise StateOrderError(
                f"adapter {name!r}: call forward and calculate_loss before backward"
            )
        self.replicas.gather(
            self.replicas.submit(
                "backward", [((name, rank in ranks), {}) for rank in range(self.dp_size)]
            )
        )

    def clip_grad_and_step(
        self, max_grad_norm: float = 1.0, adapter_name: str | None = None
    ) -> bool:
        """Step every replica; the replicas' weights and optimizer states must stay identical.

        Raises:
            AdapterLostError: The replicas diverged; the adapter is marked lost.
        """
        adapter = self._adapter(adapter_name)
        results = self.replicas.call("clip_grad_and_step", max_grad_norm, adapter.name)
        stepped, sums = results[0]
        if stepped and any(other != sums for _, other in results[1:]):
            adapter.lost = "its data-parallel replicas diverged after a step"
            raise AdapterLostError(
                f"adapter {adapter.name!r}: replicas diverged ({[s for _, s in results]})"
            )
        return stepped

    def optim_step(
        self,
        adam_params: AdamParams | dict[str, Any] | None = None,
        adapter_name: str | None = None,
    ) -> dict[str, float]:
        """``MultiLoraTransformersModel.optim_step`` on every replica (same gradients after the
        all-reduce, so the same update); their states are compared by checksum.

        Raises:
            AdapterLostError: The replicas diverged; the adapter is marked lost.
        """
        params = adam_params_of(adam_params)
        adapter = self._adapter(adapter_name)
        results = self.replicas.call("optim_step", params, adapter.name)
        metrics, sums = results[0]
        # A replacement replica rebuilds the adapter with this optimizer (recover()).
        adapter.calls["set_optimizer"] = (
            ("AdamW",),
            {"adapter_name": adapter.name, **params.optimizer_kwargs()},
        )
        if any(other != sums for _, other in results[1:]):
            adapter.lost = "its data-parallel replicas diverged after a step"
            raise AdapterLostError(
                f"adapter {adapter.name!r}: replicas diverged ({[s for _, s in results]})"
            )
        return metrics

    def clip_grad_norm(self, max_grad_norm: float = 1.0, adapter_name: str | None = None) -> float:
        """Clip on every replica (same gradients, same norm); returns the norm before clipping."""
        return self._broadcast(
            "clip_grad_norm", max_grad_norm, adapter_name=self._adapter(adapter_name).name
        )

    def step(self, adapter_name: str | None = None) -> None:
        self._broadcast("step", adapter_name=self._adapter(adapter_name).name)

    def zero_grad(self, adapter_name: str | None = None) -> None:
        self._broadcast("zero_grad", adapter_name=self._adapter(adapter_name).name)

    def lr_step(self, adapter_name: str | None = None) -> None:
        self._broadcast("lr_step", adapter_name=self._adapter(adapter_name).name)

    def check_replicas(self, adapter_name: str | None = None) -> None:
        """Compare the replicas' weights and optimizer state; mark the adapter lost if they differ.

        Raises:
            AdapterLostError: The replicas diverged.
        """
        adapter = self._adapter(adapter_name)
        sums = [s[adapter.name] for s in self.replicas.call("checksums", [adapter.name])]
        if any(other != sums[0] for other in sums[1:]):
            adapter.lost = "its data-parallel replicas diverged"
            raise AdapterLostError(f"adapter {adapter.name!r}: replicas diverged ({sums})")

    def calculate_metric(self, is_training: bool = True, adapter_name: str | None = None) -> Metric:
        """Training metrics describe the combined batches (every rank records them); evaluation
        metrics are combined over the ranks' rows (token-weighted)."""
        name = self._adapter(adapter_name).name
        metrics = self.replicas.call("call", "calculate_metric", is_training, adapter_name=name)
        if is_training:
            return metrics[0]
        results = [m.result for m in metrics]
        tokens = [r.get("num_tokens") or 0 for r in results]
        combined = dict(results[0])
        combined["num_tokens"] = sum(tokens)
        for key in ("loss", "token_acc"):
            pairs = [(r[key], t) for r, t in zip(results, tokens) if r.get(key) is not None and t]
            combined[key] = (
                sum(v * t for v, t in pairs) / sum(t for _, t in pairs) if pairs else None
            )
        return Metric(result=combined)

    # ------------------------------------------------------------------ checkpoints
    def save(
        self,
        name: str,
        output_dir: str | os.PathLike | None = None,
        save_optimizer: bool = False,
        consumed_train_samples: int | None = None,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Rank 0 writes the checkpoint (all ranks hold the same state); returns its path."""
        adapter = self._adapter(adapter_name)
        output_dir = Path(
            output_dir if output_dir is not None else Path(TWINKLE_OUTPUT_DIR.get()) / adapter.name
        ).absolute()
        (path,) = self.replicas.call(
            "call",
            "save",
            name,
            str(output_dir),
            save_optimizer,
            consumed_train_samples,
            adapter_name=adapter.name,
            ranks=[0],
            **kwargs,
        )
        adapter.checkpoint = (path, bool(save_optimizer))
        return path

    def load(self, path: str | os.PathLike, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Load weights on every replica; also restores a lost adapter."""
        self._restore(str(Path(path).absolute()), adapter_name, resumable=False)

    def resume_from_checkpoint(
        self, path: str | os.PathLike, adapter_name: str | None = None
    ) -> dict[str, Any]:
        """Resume weights, optimizer and progress on every replica; also restores a lost adapter."""
        return self._restore(str(Path(path).absolute()), adapter_name, resumable=True)

    def _restore(self, path: str, adapter_name: str | None, resumable: bool) -> Any:
        adapter = self.adapters.get(adapter_name) if adapter_name is not None else None
        if adapter is not None and adapter.lost is not None:
            return self._rebuild(adapter, (path, resumable))
        adapter = self._adapter(adapter_name)
        method = "resume_from_checkpoint" if resumable else "load"
        result = self._broadcast(method, path, adapter_name=adapter.name)
        adapter.checkpoint = (path, resumable)
        return result

    def adapter_state_dict(self, adapter_name: str | None = None) -> dict[str, Any]:
        name = self._adapter(adapter_name).name
        return self.replicas.call("call", "adapter_state_dict", adapter_name=name, ranks=[0])[0]

    def load_adapter_state_dict(
        self, state: dict[str, Any], adapter_name: str | None = None
    ) -> None:
        self._broadcast(
            "load_adapter_state_dict", state, adapter_name=self._adapter(adapter_name).name
        )


def _resolve_group(device_group: DeviceGroup | str | None) -> tuple[DeviceGroup | None, Any]:
    if device_group is None:
        return None, None
    from twinkle.parallel.initialize import current_context

    context = current_context()
    name = device_group if isinstance(device_group, str) else device_group.name
    if context is None or name not in context.groups:
        if isinstance(device_group, str):
            raise InvalidArgumentError(
                f"no device group {name!r}: pass it to twinkle.initialize(mode='ray', groups=...)"
            )
        return device_group, None
    return context.groups[name], context.placement_groups.get(name)


__all__ = ["DataParallelModel"]
