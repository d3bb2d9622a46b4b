"""``PipelineMegatronModel``: one pipeline stage's multi-LoRA megatron model (``pp_size > 1``).

Each stage holds its layers' base weights and its layers' adapters (HF names, e.g.
``model.layers.1.self_attn.q_proj`` on the second of two stages of a 2-layer model). What spans
the stages is gathered over megatron's pipeline group:

* gradient clipping: a tenant's norm is the square root of the sum of every stage's squared
  norms (one all-reduce of a ``[tenants]`` vector per fused step), so each stage clips by the
  same coefficient as one process would; the Adam step is then each stage's own;
* adapter weights (``adapter_state_dict``, ``save``): gathered to every rank, written once by
  the last stage's first rank (the rank whose results the driver answers): one standard PEFT
  adapter with the transformers backend's keys. Optimizer state and pending gradients are
  merged in the one-process parameter order (stages hold consecutive layers), so a pp
  checkpoint resumes on any layout;
* ``load`` / ``resume_from_checkpoint``: every stage reads the file and keeps its layers' part.

The LM head's adapter (``lm_head``) lives on the last stage, after its layers' adapters: the
one-process parameter order (the HF view's layers, then the head) holds across the stages too.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from twinkle.model import checkpoint as ckpt
from twinkle.model import multi_step, torch_compat
from twinkle.model.engine import _checkpoints
from twinkle.model.lora.inject import PEFT_PREFIX
from twinkle.model.megatron._pp import PipelineCausalLM, check_pp
from twinkle.model.megatron.multi_lora import MultiLoraMegatronModel
from twinkle.model.tenant import Tenant

_LAYER = re.compile(re.escape(PEFT_PREFIX) + r"model\.layers\.(\d+)\.")
_HEAD = PEFT_PREFIX + "lm_head."  # the LM head's adapter: on the last stage


def _pp_group():
    from megatron.core import parallel_state as ps

    return ps.get_pipeline_model_parallel_group()


def clip_grad_norms_over_stages(grad_lists: list[list[torch.Tensor]], max_norm: float, group):
    """``multi_step.clip_grad_norms`` whose per-tenant norm spans every pipeline stage."""
    squares = torch.zeros(len(grad_lists), dtype=torch.float32)
    for i, grads in enumerate(grad_lists):
        if grads:
            norms = torch.stack(list(torch_compat.foreach_norm(grads))).float()
            squares[i] = norms.square().sum().cpu()
    dist.all_reduce(squares, group=group)
    totals = squares.sqrt()
    coefs = torch.clamp(max_norm / (totals + 1e-6), max=1.0).tolist()
    flat = [g for grads in grad_lists for g in grads]
    if flat:
        torch_compat.foreach_mul_(flat, [c for c, gs in zip(coefs, grad_lists) for _ in gs])
    return totals.tolist()


def _gather(value: Any, world: bool = False) -> list[Any]:
    """Every pipeline stage's ``value``, in stage order (every rank's with ``world``)."""
    group = None if world else _pp_group()
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def merge_optimizer_states(states: list[dict]) -> dict:
    """Per-stage ``optimizer.state_dict()``s as one, in the one-process parameter order."""
    merged = {"state": {}, "param_groups": copy.deepcopy(states[0]["param_groups"])}
    for group in merged["param_groups"]:
        group["params"] = []
    offset = 0
    for state in states:
        count = sum(len(g["params"]) for g in state["param_groups"])
        for index, value in state["state"].items():
            merged["state"][offset + int(index)] = value
        for mine, theirs in zip(merged["param_groups"], state["param_groups"]):
            mine["params"].extend(offset + int(i) for i in theirs["params"])
        offset += count
    return merged


def slice_optimizer_state(state: dict, offset: int, count: int) -> dict:
    """This stage's part of a one-process optimizer state (parameters ``offset..+count``)."""
    groups = copy.deepcopy(state["param_groups"])
    for group in groups:
        group["params"] = [i - offset for i in group["params"] if offset <= i < offset + count]
    return {
        "state": {
            int(i) - offset: v
            for i, v in state["state"].items()
            if offset <= int(i) < offset + count
        },
        "param_groups": groups,
    }


class PipelineMegatronModel(MultiLoraMegatronModel):
    """:class:`MultiLoraMegatronModel` on one pipeline stage (built inside a worker of
    :class:`~twinkle.model.megatron.parallel.ParallelMegatronModel`).

    Args:
        num_microbatches: Microbatches per pass (default ``pp_size``); losses never depend on it.
        **kwargs: ``MultiLoraMegatronModel`` arguments, ``pp_size`` included.
    """

    causal_lm_class = PipelineCausalLM

    def __init__(self, *args: Any, num_microbatches: int | None = None, **kwargs: Any) -> None:
        from twinkle.hub import load_config

        model_id = kwargs.get("model_id", args[0] if args else None)
        check_pp(load_config(model_id), model_id, kwargs.get("pp_size", 1))
        super().__init__(*args, **kwargs)
        self.model.microbatches = num_microbatches or self.pp_size
        self._sync_pass_budget()

    def _sync_pass_budget(self) -> None:
        """Every rank plans the same passes: on a GPU the default budget follows each stage's
        free memory, so the smallest one is taken by all."""
        if self.options.max_pass_tokens is not None or self.device.type != "cuda":
            return
        import dataclasses

        from twinkle.model.step.plan import pass_token_budget

        budget = torch.tensor([pass_token_budget(None, self.model, self.device) or 0])
        dist.all_reduce(budget, op=dist.ReduceOp.MIN)
        self.options = dataclasses.replace(self.options, max_pass_tokens=int(budget) or None)

    def _forward_backward_many(self, requests):
        # Only the fused path tracks which microbatches a failure must answer: gradients the
        # previous stage waits on from an earlier ``forward`` (never backpropagated) are not.
        self.model.outstanding.clear()
        self.model.current_pass = None
        try:
            return super()._forward_backward_many(requests)
        except BaseException:
            # This stage failed the pass (before or during its backward): take what the next
            # stage still sends for it, then fail the previous stage's pass too. A stage that
            # fails alone before the backward of a multi-pass call is not covered (the next
            # stage would wait for the next pass's activations): docs/megatron.md.
            self.model.drain()
            self.model.abort_outstanding()
            raise

    # ----------------------------------------------------------- clipping across stages
    @contextlib.contextmanager
    def _norms_over_stages(self):
        # The step code calls ``multi_step.clip_grad_norms``; this worker process holds one model
        # and runs one call at a time, so swapping it for the call is safe.
        original = multi_step.clip_grad_norms
        multi_step.clip_grad_norms = lambda grads, max_norm: clip_grad_norms_over_stages(
            grads, max_norm, _pp_group()
        )
        try:
            yield
        finally:
            multi_step.clip_grad_norms = original

    def _step_agreement(self, ok: bool) -> bool:
        """Every stage keeps a step only if none of its parts of the adapters overflowed."""
        flag = torch.tensor([1.0 if ok else 0.0])  # on the CPU, as the stages' norm sums
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=_pp_group())
        return bool(flag.item())

    def _clip_grad_and_step_many(self, adapter_names, max_grad_norm):
        with self._norms_over_stages():
            return super()._clip_grad_and_step_many(adapter_names, max_grad_norm)

    def clip_grad_norm(self, max_grad_norm: float = 1.0, adapter_name: str | None = None):
        with self._norms_over_stages():
            return super().clip_grad_norm(max_grad_norm, adapter_name)

    def optim_step(self, adam_params=None, adapter_name: str | None = None):
        with self._norms_over_stages():
            return super().optim_step(adam_params, adapter_name)

    # -------------------------------------------------------------- checkpoints
    def adapter_state_dict(self, adapter_name: str | None = None) -> dict[str, torch.Tensor]:
        """The tenant's whole adapter (every stage's layers), PEFT-keyed, on every rank."""
        merged: dict[str, torch.Tensor] = {}
        for part in _gather(super().adapter_state_dict(adapter_name)):
            merged.update(part)
        return merged

    def load_adapter_state_dict(
        self, state: dict[str, torch.Tensor], adapter_name: str | None = None
    ) -> None:
        """Keep this stage's layers of a whole adapter state (keys of other layers are checked
        to exist in the model)."""
        mine = {}
        head = getattr(self.model, "lm_head", None) is not None  # the last stage's
        for key, value in state.items():
            if key.startswith(_HEAD):
                if head:
                    mine[key] = value
                continue
            match = _LAYER.match(key)
            layer = int(match.group(1)) if match else -1
            if not 0 <= layer < self.config_layers:
                raise ValueError(f"adapter weights do not fit the model: unexpected key {key}")
            if layer in self.layers:
                mine[key] = value
        super().load_adapter_state_dict(mine, adapter_name)

    @property
    def config_layers(self) -> int:
        return self.model.config.num_hidden_layers

    def _is_writer(self) -> bool:
        from megatron.core import parallel_state as ps

        return (
            ps.is_pipeline_last_stage()
            and ps.get_tensor_model_parallel_rank() == 0
            and ps.get_data_parallel_rank() == 0
        )

    def save(
        self,
        name: str,
        output_dir: str | os.PathLike | None = None,
        save_optimizer: bool = False,
        consumed_train_samples: int | None = None,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> str:
        """As the one-process model's ``save`` (run on every rank; one writes)."""
        tenant = self.tenant(adapter_name)
        weights = self.adapter_state_dict(tenant.name)
        with_optimizer = save_optimizer and tenant.optimizer is not None
        optimizer = grads = None
        if with_optimizer:
            optimizer = merge_optimizer_states(_gather(tenant.optimizer.state_dict()))
            if tenant.pending_grads:
                grads = [g for part in _gather([p.grad for p in tenant.params]) for g in part]
        path = None
        if self._is_writer():
            path = _checkpoints.save(
                tenant,
                self.model,
                model_id=self.model_id,
                model_dir=self.model_dir,
                name=name,
                output_dir=output_dir,
                save_optimizer=save_optimizer,
                consumed_train_samples=consumed_train_samples,
                weights=weights,
                optimizer_state=optimizer,
                grads=grads,
            )
        (path,) = [p for p in _gather(path, world=True) if p is not None]
        return path

    def load(self, path: str | os.PathLike, adapter_name: str | None = None, **kwargs: Any):
        """Load adapter weights only; each stage keeps its layers."""
        tenant = self.tenant(adapter_name)
        _checkpoints.load_weights(tenant, self.model, path, self._stage_loader(tenant))

    def _stage_loader(self, tenant: Tenant) -> Callable[[dict[str, torch.Tensor]], None]:
        """Puts a whole adapter state into ``tenant``: this stage's layers."""
        return functools.partial(self.load_adapter_state_dict, adapter_name=tenant.name)

    def resume_from_checkpoint(self, path: str | os.PathLike, adapter_name: str | None = None):
        """As the one-process model's: weights and this stage's part of the optimizer state."""
        tenant = self.tenant(adapter_name)
        counts = _gather(len(tenant.params))
        offset, count = sum(counts[: self.stage]), counts[self.stage]

        def read(file: Path) -> Any:
            # This stage's slice of the state of every stage's parameters.
            value = _checkpoints.read_state(file)
            if file.name == ckpt.OPTIMIZER_STATE:
                return slice_optimizer_state(value, offset, count)
            if file.name == ckpt.PENDING_GRADS:
                return value[offset : offset + count]
            return value

        return _checkpoints.resume(
            tenant,
            self.model,
            self.model_id,
            Path(path),
            set_optimizer=functools.partial(self.set_optimizer, adapter_name=tenant.name),
            set_lr_scheduler=functools.partial(self.set_lr_scheduler, adapter_name=tenant.name),
            load_state=self._stage_loader(tenant),
            read=read,
        )


__all__ = ["PipelineMegatronModel", "clip_grad_norms_over_stages", "merge_optimizer_states"]
