"""The tenant engine: many tenants' LoRA adapters, optimizers and steps over one frozen base model.

Every backend builds its base model (:class:`BaseModel`: the module with HF module names and the
LoRA router its adapted layers route rows by) and hands it to :class:`TenantEngine`, which owns
everything per tenant. The backends' public classes (``MultiLoraTransformersModel``,
``MultiLoraMegatronModel``) are the engine over the base model each builds; they do not derive
from one another."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from twinkle.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    StateOrderError,
    UnknownAdapterError,
)
from twinkle.model.engine._checkpoint_methods import CheckpointMethods
from twinkle.model.engine._optimizer_methods import OptimizerMethods
from twinkle.model.flat import FlatAdapter
from twinkle.model.lora import (
    LoraRouter,
    RowRoute,
    adapter_module_names,
    adapter_parameters,
    adapter_spec_from_config,
    inject_adapter,
    remove_adapter,
    resolve_target_parameters,
)
from twinkle.model.metrics import Metric, record_attached_metrics
from twinkle.model.optim import build_optimizer, build_scheduler, check_scheduler_name
from twinkle.model.options import ExecutionOptions
from twinkle.model.paging import AdapterPager
from twinkle.model.protocol import AdamParams, Capabilities
from twinkle.model.step import (
    ForwardState,
    TenantBatch,
    attach_grads,
    collate,
    compute_loss,
    forward_batches,
    fused_forward_backward,
    loss_of,
    public_forward_output,
    public_output,
    record_metrics,
    record_train_metrics,
    with_loss_inputs,
)
from twinkle.model.step.tensors import is_collated
from twinkle.model.step.vision import check_images_supported
from twinkle.model.tenant import Tenant, TrainConfigs
from twinkle.model.threads import small_on_cpu
from twinkle_client.tracking.history import TrainingHistory
from twinkle_client.types import ForwardOutput


@dataclass
class BaseModel:
    """What a backend builds and the engine trains adapters on.

    Attributes:
        model_id: The id the model was loaded by (``tiny://qwen3.5``, ``ms://org/name``, ...).
        model_dir: Its local directory.
        device: Where the module lives.
        module: The frozen causal LM; its adaptable linears carry HF module names (PEFT keys).
        router: The LoRA router the module's adapted layers route rows by.
        options: How passes execute (read once, at construction).
        recompute: The decoder layers' recompute switch (``None``: the passes never recompute).
    """

    model_id: str
    model_dir: str | Path
    device: torch.device
    module: torch.nn.Module
    router: LoraRouter
    options: ExecutionOptions
    recompute: Any = None


class TenantEngine(CheckpointMethods, OptimizerMethods):
    """A frozen base model shared by many tenants, each training its own LoRA adapter.

    Every method takes ``adapter_name=``; when exactly one adapter exists it is the default.
    Tenants are isolated: one tenant's calls never change another tenant's weights, optimizer
    state, loss, template or progress.

    Args:
        base: The base model a backend built (:class:`BaseModel`).
        seed: Seed for adapter initialisation.
    """

    max_adapters: int | None = None
    #: Ranks whose backward passes pair up (megatron expert parallel: its all-to-alls) set this:
    #: called before each fused pass's backward with this rank's forward/loss failure or None,
    #: it raises when any rank failed (``fused.forward_backward_many``'s ``agree``).
    _pass_agreement: Callable[[BaseException | None], None] | None = None
    capabilities = Capabilities(
        fused_forward_backward=True,
        batched_optimizer_step=True,
        adapter_paging=True,
        adapter_state_io=True,
        local_tenants=True,
    )
    #: The decoder layers' recompute switch; ``None`` where the base model has none.
    recompute: Any = None

    def __init__(self, base: BaseModel, seed: int = 0) -> None:
        self.options = base.options
        self.model_id = base.model_id
        self.model_dir = base.model_dir
        self.device = base.device
        self.model = base.module
        self.router = base.router
        self.recompute = base.recompute
        self.seed = seed
        self.tenants: dict[str, Tenant] = {}
        self.pager: AdapterPager | None = None

    def enable_paging(self, max_resident: int, **kwargs: Any) -> AdapterPager:
        """Keep at most ``max_resident`` adapters on the device and page idle ones out (see
        :class:`~twinkle.model.paging.AdapterPager` for ``mode``, ``storage_dir``, ...)."""
        self.pager = AdapterPager(max_resident, **kwargs)
        self.pager.resident.update(dict.fromkeys(self.tenants))
        self.pager.make_room(self.tenants, "")
        return self.pager

    @property
    def direct_weight_grads(self) -> bool:
        """``options.direct_weight_grads``: the fused step's LoRA layers add weight gradients
        straight into the tenants' flat buffers."""
        return self.options.direct_weight_grads

    def _small_cpu(self, tensors: list[torch.Tensor]) -> bool:
        """Whether the small-GEMM thread rule puts work on ``tensors`` on one thread."""
        return self.options.small_gemm_one_thread and small_on_cpu(
            tensors, self.options.small_tensor_elements
        )

    # ----------------------------------------------------------------- adapters
    def add_adapter_to_model(
        self,
        adapter_name: str,
        config: Any = None,
        gradient_accumulation_steps: int = 1,
        save_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> None:
        """Create tenant ``adapter_name`` with its own LoRA adapter: ``config`` is a
        ``peft.LoraConfig``, a dict, or a PEFT adapter directory (its ``adapter_config.json``).
        ``save_dir`` is where its checkpoints go when ``save()`` is given no ``output_dir``
        (default ``$TWINKLE_OUTPUT_DIR/<adapter_name>``). ``display_name=`` is the name
        messages show for the adapter where ``adapter_name`` is a key its owner never reads
        (a server's internal id; :attr:`Tenant.display_name`).

        Raises:
            ValueError: Duplicate name, rank <= 0, bad accumulation steps, or no matching module.
        """
        if adapter_name in self.tenants:
            raise InvalidArgumentError(f"adapter {adapter_name!r} already exists on this model")
        if self.max_adapters is not None and len(self.tenants) >= self.max_adapters:
            raise InvalidArgumentError(
                f"{type(self).__name__} holds at most {self.max_adapters} adapter(s)"
            )
        if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
            raise InvalidArgumentError(
                f"gradient_accumulation_steps must be an integer >= 1, got {gradient_accumulation_steps!r}"
            )
        spec = adapter_spec_from_config(adapter_name, config, seed=kwargs.pop("seed", self.seed))
        display_name = kwargs.pop("display_name", None)
        if kwargs:
            raise ArgumentTypeError(f"unexpected arguments: {', '.join(kwargs)}")
        # Fail before touching the model.
        adapter_module_names(self.model, spec)
        resolve_target_parameters(self.model, spec)
        if self.pager is not None:
            self.pager.added(self.tenants, adapter_name)  # frees a slot (or raises) first
        try:
            inject_adapter(self.model, self.router, spec)
        except BaseException:
            if self.pager is not None:
                self.pager.removed(adapter_name)
            raise
        self.tenants[adapter_name] = Tenant(
            name=adapter_name,
            spec=spec,
            params=adapter_parameters(self.model, adapter_name),
            gradient_accumulation_steps=gradient_accumulation_steps,
            display_name=display_name,
        )
        tenant = self.tenants[adapter_name]
        for param in tenant.params:
            param.requires_grad_(True)
        tenant.flat = FlatAdapter.build(tenant.params)
        self._set_save_dir(adapter_name, save_dir)
        self.set_loss("CrossEntropyLoss", adapter_name=adapter_name)

    def remove_adapter(self, adapter_name: str | None = None) -> None:
        """Drop a tenant: its weights, optimizer and state are freed."""
        tenant = self.tenant(adapter_name, page_in=False)
        remove_adapter(self.model, tenant.name)
        del self.tenants[tenant.name]
        if self.pager is not None:
            self.pager.removed(tenant.name)

    def list_adapters(self) -> list[str]:
        return list(self.tenants)

    def tenant(self, adapter_name: str | None = None, page_in: bool = True) -> Tenant:
        """The state of tenant ``adapter_name`` (the only one when ``None`` and one exists),
        paged in first (unless ``page_in`` is False) when paging is on.

        Raises:
            ValueError: Unknown name, no adapter, or ``None`` while several exist.
        """
        if adapter_name is None and len(self.tenants) == 1:
            adapter_name = next(iter(self.tenants))
        if adapter_name is None:
            if not self.tenants:
                raise UnknownAdapterError(
                    "no adapter on this model: call add_adapter_to_model first"
                )
            raise InvalidArgumentError(
                f"several adapters exist ({', '.join(self.tenants)}): pass adapter_name="
            )
        if adapter_name not in self.tenants:
            known = ", ".join(self.tenants) or "none"
            raise UnknownAdapterError(
                f"unknown adapter {adapter_name!r}; adapters on this model: {known}"
            )
        tenant = self.tenants[adapter_name]
        if page_in and self.pager is not None:
            self.pager.ensure(self.tenants, tenant)
        return tenant

    def _pinned(self, names: list[str]):
        """One call's tenants stay resident together while it runs."""
        return self.pager.pinning(names) if self.pager is not None else nullcontext()

    # ------------------------------------------------------------ configuration
    def set_template(self, template: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Set the tenant's chat template (a name such as ``'Qwen3_5Template'``, a class or an instance)."""
        from twinkle.template import Template, get_template

        tenant = self.tenant(adapter_name)
        if isinstance(template, Template):
            tenant.template = template
        else:
            kwargs.setdefault("model_id", self.model_id)
            tenant.template = get_template(template, **kwargs)
        tenant.template_name = type(tenant.template).__name__
        tenant.processor = None  # the processor's padding id follows the template

    def set_processor(self, processor: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Set how the tenant's samples become tensors (``'InputProcessor'``, ``padding_side=...``,
        or a processor instance, used as is)."""
        tenant = self.tenant(adapter_name)
        if isinstance(processor, str):
            config = {"name": processor, **kwargs}
            # Built before it is kept: an unknown name or argument changes nothing.
            tenant.processor = self._build_processor(tenant, config)
            tenant.processor_config = config
        else:
            tenant.processor_config = {"name": type(processor).__name__, **kwargs}
            tenant.processor = processor

    def _build_processor(self, tenant: Tenant, config: dict[str, Any] | None = None):
        from twinkle.processor import get_processor

        config = dict(config or tenant.processor_config or {"name": "InputProcessor"})
        name = config.pop("name")
        if config.get("pad_token_id") is None:
            config["pad_token_id"] = self._template_of(tenant).pad_token_id
        try:
            return get_processor(name, **config)
        except (ValueError, TypeError) as exc:  # unknown name or argument: the caller's mistake
            raise InvalidArgumentError(f"processor: {exc}") from None

    def set_loss(self, loss: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Set the tenant's loss: a name (``'CrossEntropyLoss'``, ``'GRPOLoss'``, ...), class or instance."""
        from twinkle.loss import get_loss

        tenant = self.tenant(adapter_name)
        tenant.loss = get_loss(loss, **kwargs)
        tenant.loss_config = {
            "name": getattr(tenant.loss, "name", type(tenant.loss).__name__),
            **kwargs,
        }

    def set_optimizer(self, optimizer: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Set the tenant's optimizer (``'Adam'``, ``'AdamW'``, ``'SGD'`` or a class), e.g. ``lr=1e-4``."""
        tenant = self.tenant(adapter_name)
        tenant.optimizer = build_optimizer(
            optimizer, tenant.params, fused_adam=self.options.fused_adam, **kwargs
        )
        tenant.optimizer_config = {
            "name": optimizer if isinstance(optimizer, str) else optimizer.__name__,
            **kwargs,
        }
        if tenant.scheduler_config is not None:
            config = dict(tenant.scheduler_config)
            tenant.scheduler = build_scheduler(config.pop("name"), tenant.optimizer, **config)

    def set_lr_scheduler(
        self, scheduler: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        """Set the tenant's learning-rate scheduler (``'LinearLR'``, ``'cosine'``, ``'constant'``, ...)."""
        tenant = self.tenant(adapter_name)
        check_scheduler_name(scheduler)
        if tenant.optimizer is None:
            self.set_optimizer("AdamW", adapter_name=tenant.name)
        tenant.scheduler = build_scheduler(scheduler, tenant.optimizer, **kwargs)
        tenant.scheduler_config = {
            "name": scheduler if isinstance(scheduler, str) else scheduler.__name__,
            **kwargs,
        }

    def get_train_configs(self, adapter_name: str | None = None) -> TrainConfigs:
        """The tenant's configuration, as a pydantic model (``.model_dump()``)."""
        return self.tenant(adapter_name).train_configs(self.model_id)

    def _template_of(self, tenant: Tenant):
        """The tenant's template (the plain ``Template`` until one is set)."""
        if tenant.template is None:
            self.set_template("Template", adapter_name=tenant.name)
        return tenant.template

    def _processor_of(self, tenant: Tenant):
        """The tenant's input processor (built from its config and template when first used)."""
        if tenant.processor is None:
            tenant.processor = self._build_processor(tenant)
        return tenant.processor

    # ----------------------------------------------------------------- training
    def forward(
        self, inputs: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Forward with gradients kept for a later ``calculate_loss`` + ``backward``."""
        tenant = self.tenant(adapter_name)
        tenant.last_forward = self._forward(tenant, inputs, kwargs, grad=True)
        return ForwardOutput(public_forward_output(tenant.last_forward))

    def calculate_loss(self, adapter_name: str | None = None, **kwargs: Any) -> float:
        """Apply the tenant's loss to the last ``forward``; returns the loss value."""
        tenant = self.tenant(adapter_name)
        if tenant.last_forward is None:
            raise StateOrderError(f"adapter {tenant.label!r}: call forward before calculate_loss")
        state = tenant.last_forward
        state.batch = with_loss_inputs(state.batch, kwargs)
        compute_loss(state, loss_of(state.batch, tenant))
        return float(state.loss_output.loss.detach())

    def backward(self, adapter_name: str | None = None) -> None:
        """Backpropagate the last calculated loss into the tenant's adapter gradients."""
        tenant = self.tenant(adapter_name)
        state = tenant.last_forward
        if state is None or state.loss_output is None:
            raise StateOrderError(
                f"adapter {tenant.label!r}: call forward and calculate_loss before backward"
            )
        attach_grads([tenant])
        (state.loss_output.loss / tenant.gradient_accumulation_steps).backward()
        record_train_metrics(tenant, state)
        tenant.last_forward = None

    def forward_backward(
        self, inputs: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Forward, loss and backward for one micro-batch of the tenant.

        Args:
            inputs: Encoded features (``InputFeature`` / dicts with ``input_ids`` and ``labels``),
                trajectories (encoded with the tenant's template), or collated tensors.
            adapter_name: The tenant.
            **kwargs: Loss inputs such as ``advantages`` ([B] or per token), ``old_logprobs``
                (or ``old_logps``), ``ref_outputs`` (what ``forward_only(...,
                disable_lora=True)`` returned: the reference of a DPO-style loss), a teacher's
                ``teacher_topk_logprobs`` / ``teacher_topk_indices``; ``task='embedding'`` for
                an embedding batch (see ``docs/losses.md``).

        Returns:
            ``{'loss': float, 'logprobs': [per-row target log-probs], 'num_tokens': int,
            'metrics': {...}}`` (and ``'embeddings'`` for an embedding batch).
        """
        return self.forward_backward_many(
            {self.tenant(adapter_name).name: {"inputs": inputs, **kwargs}}
        )[self.tenant(adapter_name).name]

    def forward_backward_many(
        self, requests: dict[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        """One base-model pass for several tenants' micro-batches, each row with its own adapter.

        Args:
            requests: ``{adapter_name: {'inputs': ..., **loss_kwargs}}``, the arguments each
                tenant's ``forward_backward`` would take.

        Returns:
            Each tenant's ``forward_backward`` result. Gradients land only in each tenant's adapter
            and equal those of separate per-tenant passes.
        """
        with self._pinned(list(requests)):
            return self._forward_backward_many(requests)

    def _forward_backward_many(
        self, requests: dict[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        batches, tenants = [], []
        for name, request in requests.items():
            tenant = self.tenant(name)
            request = dict(request)
            if "inputs" not in request:
                raise InvalidArgumentError(f"request for adapter {name!r} has no 'inputs'")
            if request.pop("disable_lora", False):
                raise InvalidArgumentError(
                    "disable_lora applies to forward_only (a pass of the base model alone, e.g. "
                    "a DPO reference); forward_backward trains the adapter"
                )
            batches.append(self._collate(tenant, request.pop("inputs"), request))
            tenants.append(tenant)
        return fused_forward_backward(
            self.model,
            self.router,
            self.device,
            batches,
            tenants,
            direct_weight_grads=self.direct_weight_grads,
            options=self.options,
            recompute=self.recompute,
            agree=self._pass_agreement,
        )

    def forward_only(
        self,
        inputs: Any,
        adapter_name: str | None = None,
        disable_lora: bool = False,
        **kwargs: Any,
    ) -> ForwardOutput:
        """Forward without gradients; returns loss and per-row target log-probabilities.

        Args:
            inputs: As for :meth:`forward_backward`.
            adapter_name: The tenant.
            disable_lora: Run the base model without the tenant's adapter: the reference pass
                of DPO-style training. No loss is applied and no evaluation metric recorded
                (the pass is not the tenant's model); pass the result to
                ``forward_backward(..., ref_outputs=...)``.
            **kwargs: Loss inputs, as for :meth:`forward_backward`.

        Returns:
            A ``ForwardOutput`` (a dict, also reachable as ``.result``): ``logprobs`` (per row,
            at the trained positions), ``num_tokens`` and, unless ``disable_lora``, ``loss`` and
            ``metrics``; ``embeddings`` for ``task='embedding'`` (rows without labels: the
            embeddings alone, no loss).
        """
        tenant = self.tenant(adapter_name)
        with torch.no_grad():
            state = self._forward(tenant, inputs, kwargs, grad=False, bare=disable_lora)
            unlabelled = state.batch.task == "embedding" and state.batch.row_labels is None
            if disable_lora or unlabelled:
                return ForwardOutput(public_forward_output(state))
            compute_loss(state, loss_of(state.batch, tenant))
        record_metrics(tenant.eval_metrics, state)
        record_attached_metrics(tenant, state, False)
        return ForwardOutput(public_output(state))

    def _collate(self, tenant: Tenant, inputs: Any, kwargs: dict[str, Any]) -> TenantBatch:
        """The tenant's inputs as a batch; its template and processor are only looked up (and
        built when first used) for inputs that are not collated tensors yet."""
        raw = not is_collated(inputs)
        batch = collate(
            tenant.name,
            inputs,
            kwargs,
            template=self._template_of(tenant) if raw else None,
            processor=self._processor_of(tenant) if raw else None,
            vocab_size=self.model.get_input_embeddings().weight.shape[0],
            tenant_loss=tenant.loss,
        )
        check_images_supported(self.model, batch)
        return batch

    def _forward(
        self, tenant: Tenant, inputs: Any, kwargs: dict[str, Any], grad: bool, bare: bool = False
    ) -> ForwardState:
        batch = self._collate(tenant, inputs, kwargs)
        return forward_batches(
            self.model,
            self.router,
            self.device,
            [batch],
            [loss_of(batch, tenant)],
            grad=grad,
            options=self.options,
            bare=bare,
            entropies=tenant.attached_metrics.wants_entropies(grad),
        )[0]

    def add_metric(
        self,
        metric_cls: Any,
        is_training: bool | None = None,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Attach a metric by name (``'DPOMetric'``, ``'EmbeddingMetric'``, ...) or class to the
        tenant: fed after training forwards (``is_training=True``), ``forward_only``
        (``False``) or both (``None``) and reported by ``calculate_metric``; ``kwargs``
        configure it (``beta=0.1``).

        Raises:
            InvalidArgumentError: An unknown or client-side metric, or arguments it does not take.
        """
        self.tenant(adapter_name).attached_metrics.add(metric_cls, is_training, **kwargs)

    def calculate_metric(self, is_training: bool = True, adapter_name: str | None = None) -> Metric:
        """Averages since the last call: loss, token_acc, grad_norm, lr, step."""
        tenant = self.tenant(adapter_name)
        result = (tenant.train_metrics if is_training else tenant.eval_metrics).report()
        result.update(grad_norm=tenant.last_grad_norm, lr=tenant.lr(), step=tenant.cur_step)
        result.update(tenant.attached_metrics.report(is_training))
        return Metric(result=result)

    # ----------------------------------------------------------------- history
    def get_training_history(
        self, adapter_name: str | None = None, since_step: int | None = None
    ) -> TrainingHistory:
        """One point per optimizer step of the tenant (loss, tokens, learning rate, gradient
        norm, the loss's metrics, step time), after ``since_step`` if given; bounded and thinned
        as :mod:`twinkle.tracking` says."""
        tenant = self.tenant(adapter_name)
        return tenant.history.history(tenant.name, since_step)

    def step(self, adapter_name: str | None = None) -> None:
        tenant = self.tenant(adapter_name)
        lr = tenant.lr()
        super().step(adapter_name=tenant.name)
        tenant.history.stepped(tenant.cur_step, lr, tenant.last_grad_norm)

    def clip_grad_and_step_many(
        self, adapter_names: list[str], max_grad_norm: float = 1.0
    ) -> dict[str, bool]:
        lrs = {name: self.tenant(name).lr() for name in adapter_names}  # what this step uses
        stepped = super().clip_grad_and_step_many(adapter_names, max_grad_norm)
        for name in adapter_names:
            if stepped[name]:
                tenant = self.tenant(name)
                lr = tenant.lr() if lrs[name] is None else lrs[name]
                tenant.history.stepped(tenant.cur_step, lr, tenant.last_grad_norm)
        return stepped

    def optim_step(
        self,
        adam_params: AdamParams | dict[str, Any] | None = None,
        adapter_name: str | None = None,
    ) -> dict[str, float]:
        tenant = self.tenant(adapter_name)
        result = super().optim_step(adam_params, adapter_name=tenant.name)
        tenant.history.stepped(tenant.cur_step, result["learning_rate"], result["grad_norm"])
        return result

    def routes(self, routes: list[RowRoute]):
        """Context manager: route batch rows to adapters for direct ``self.model`` calls."""
        return self.router.route(routes)


__all__ = ["BaseModel", "TenantEngine"]
