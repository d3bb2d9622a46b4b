"""``MultiLoraMegatronModel``: the tenant engine over a megatron-core GPTModel."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from typing import Any

import torch

from twinkle.errors import InvalidArgumentError
from twinkle.hub import load_config, resolve_model_dir
from twinkle.model.engine import BaseModel, TenantEngine
from twinkle.model.lora import LoraRouter, adapter_spec_from_config
from twinkle.model.megatron import _build, _moe, _tp_optim
from twinkle.model.megatron._model import MegatronCausalLM
from twinkle.model.options import ExecutionOptions, resolve_options

#: The optimizers this backend accepts (the seed: "Megatron backend: Adam only").
#: ``'default'`` is Megatron's default optimizer, Adam.
ADAM_FAMILY = {"default": "Adam", "Adam": "Adam", "AdamW": "AdamW"}
_SHARDED_TYPES = tuple(_tp_optim.SHARDED.values())
#: The HF name of the output layer, which peft would adapt when a selector names it.
OUTPUT_LAYER = "lm_head"


def _selects_output_layer(selector: Any) -> bool:
    if isinstance(selector, str):
        return re.fullmatch(selector, OUTPUT_LAYER) is not None
    return OUTPUT_LAYER in selector


#: The HF view's adapted projections (see :mod:`~twinkle.model.megatron._model`).
_PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def _selects_head_only(selector: Any, hf_config: Any) -> bool:
    """``selector`` picks ``lm_head`` and none of the layers' projections (decided the same on
    every pipeline stage, from the config alone)."""
    from twinkle.model.lora.inject import _selects

    if selector == "all-linear" or not _selects_output_layer(selector):
        return False
    names = (
        f"model.layers.{i}.{p}" for i in range(hf_config.num_hidden_layers) for p in _PROJECTIONS
    )
    return not any(_selects(selector, name) for name in names)


class MultiLoraMegatronModel(TenantEngine):
    """Many tenants' LoRA adapters on one frozen megatron-core ``GPTModel`` (tensor parallel 1).

    Same public API and semantics as :class:`~twinkle.model.MultiLoraTransformersModel` (LoRA on
    ``lm_head`` included; under pp only with some layers too); it only builds a different base model (HF weights converted
    to megatron's layout) and accepts only Adam-family optimizers. Adapters carry HF module names, so saved checkpoints are standard PEFT
    adapters of the HF model. Supports Qwen3 dense models; Qwen3.5 (linear attention) is refused.

    Args:
        model_id: ``tiny://qwen3``, ``ms://org/name``, ``hf://org/name`` or a local directory.
        torch_dtype: Weights dtype (float32 on CPU, bfloat16 on CUDA by default).
        device: Torch device; CUDA when available unless given.
        seed: Seed for adapter initialisation.

    Raises:
        ValueError: An unsupported architecture (Qwen3.5, MoE, RoPE scaling).
        RuntimeError: megatron-core is not installed.
    """

    #: The base model's wrapper (a pipeline stage's model replaces it: ``_pp``).
    causal_lm_class = MegatronCausalLM
    #: As the transformers backend's, less paging: adapters sharded over tensor-parallel ranks
    #: are not paged.
    capabilities = dataclasses.replace(TenantEngine.capabilities, adapter_paging=False)

    def __init__(
        self,
        model_id: str,
        torch_dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        seed: int = 0,
        options: ExecutionOptions | dict[str, Any] | None = None,
        tp_size: int = 1,
        pp_size: int = 1,
        **unused: Any,
    ) -> None:
        options = resolve_options(options)
        hf_config = load_config(model_id)
        _build.check_supported(hf_config, model_id)
        try:
            import megatron.core  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                "backend 'megatron' needs megatron-core (pip install megatron-core==0.16.1)"
            ) from exc
        model_dir = resolve_model_dir(model_id)
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if isinstance(torch_dtype, str) and torch_dtype != "auto":
            torch_dtype = getattr(torch, torch_dtype)
        dtype = (
            torch_dtype
            if isinstance(torch_dtype, torch.dtype)
            else (torch.bfloat16 if device.type == "cuda" else torch.float32)
        )
        _build.check_tp(hf_config, model_id, tp_size)
        _build.init_megatron(device, seed, tp_size, pp_size)
        from megatron.core import parallel_state

        self.tp_size, self.tp_rank = tp_size, parallel_state.get_tensor_model_parallel_rank()
        self.pp_size, self.stage = pp_size, parallel_state.get_pipeline_model_parallel_rank()
        # This pipeline stage's HF layers (all of them at pp 1), megatron's even split.
        per_stage = hf_config.num_hidden_layers // pp_size
        self.layers = range(self.stage * per_stage, (self.stage + 1) * per_stage)
        # megatron-core's own recompute settings, in the config when the options may use them;
        # the step turns them on per pass (``on``: every training pass; ``auto``: a pass over
        # the budget), as on the transformers backend.
        recompute = options.activation_recompute != "off"
        gpt = _build.build_gpt(hf_config, dtype, pp_size, self.stage, recompute=recompute)
        _build.load_hf_weights(
            gpt,
            _build.read_hf_state_dict(model_dir),
            hf_config,
            tp_size,
            self.tp_rank,
            self.layers,
        )
        router = LoraRouter(kernel=options.lora_kernel)
        module = self.causal_lm_class(
            gpt.to(device), hf_config, router, device, tp_size, self.layers
        )
        module.requires_grad_(False)
        module.eval()
        switch = module.install_recompute(router) if recompute else None
        super().__init__(
            BaseModel(model_id, model_dir, device, module, router, options, switch), seed=seed
        )

    def add_adapter_to_model(
        self,
        adapter_name: str,
        config: Any = None,
        gradient_accumulation_steps: int = 1,
        **kwargs: Any,
    ) -> None:
        """As the transformers backend; the LM head (``lm_head``, megatron's ``output_layer``)
        is adapted when ``target_modules`` names it (under pipeline parallel on the last stage).

        Raises:
            InvalidArgumentError: ``target_modules`` selects only ``lm_head`` with
                ``pp_size > 1``, or any LoraConfig field the transformers backend refuses.
        """
        spec = adapter_spec_from_config(adapter_name, config)
        selector = spec.target_modules
        if self.pp_size > 1 and _selects_head_only(selector, self.model.config):
            # The head lives on the last stage: every earlier stage would hold no part of this
            # adapter (a tenant without parameters there). Heads with layers work (Tinker's
            # train_unembed): the layers' parts on their stages, the head's on the last.
            raise InvalidArgumentError(
                f"adapter {adapter_name!r}: LoraConfig field target_modules={selector!r} is "
                f"refused: it selects only {OUTPUT_LAYER!r}, which backend 'megatron' holds on "
                "the last pipeline stage alone (pp_size > 1); add layers to it, e.g. "
                "'q_proj', or use pp_size 1"
            )
        _moe.check_adapter_targets(self.model.config, adapter_name, selector)
        super().add_adapter_to_model(adapter_name, config, gradient_accumulation_steps, **kwargs)

    @property
    def expert_token_scales(self):
        """The expert adapters' per-rank gradient scales of the running call (expert parallel;
        see :mod:`._moe_lora`)."""
        return self.model.expert_token_scales

    def expert_parameters(self, adapter_name: str) -> list[torch.nn.Parameter]:
        """Tenant ``adapter_name``'s expert-adapter parameters (empty without any)."""
        name = self.tenant(adapter_name).name
        return [p for m in self.model.expert_layers() for p in m.adapter_weights(name).values()]

    def computed_rows(self) -> tuple[int, int]:
        """The rows and padded tokens this model's base model has run forward so far (a pipeline
        stage's model counts none)."""
        return self.model.rows_computed, self.model.tokens_computed

    def set_optimizer(self, optimizer: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Set the tenant's optimizer: ``'default'`` (Adam), ``'Adam'`` or ``'AdamW'``.

        Raises:
            ValueError: Any other optimizer (the megatron backend supports Adam only).
        """
        cls = optimizer if isinstance(optimizer, type) else None
        if cls in (torch.optim.Adam, torch.optim.AdamW):
            name = cls.__name__
        elif isinstance(optimizer, str) and optimizer in ADAM_FAMILY:
            name = optimizer
        else:
            raise InvalidArgumentError(
                f"backend 'megatron' supports Adam optimizers only ('default', 'Adam', 'AdamW'), "
                f"got {getattr(optimizer, '__name__', optimizer)!r}"
            )
        family = ADAM_FAMILY[name]
        # tp > 1: each rank keeps its chunk of the tenant's Adam moments (``_tp_optim``).
        cls = _tp_optim.SHARDED[family] if self.tp_size > 1 else family
        super().set_optimizer(cls, adapter_name=adapter_name, **kwargs)
        self.tenant(adapter_name).optimizer_config["name"] = name  # resume rebuilds 'default'

    def optimizer_state_numel(self, adapter_name: str | None = None) -> int:
        """Elements of the tenant's Adam moments this process holds (``1/tp`` of the
        adapter's twice under tensor parallel; 0 before its first step)."""
        optimizer = self.tenant(adapter_name).optimizer
        if optimizer is None:
            return 0
        # A sharded optimizer's state is its chunk's: the same count covers both.
        return sum(
            value.numel()
            for entry in optimizer.state.values()
            for key, value in entry.items()
            if key in ("exp_avg", "exp_avg_sq")
        )

    def save(
        self,
        name: str,
        output_dir: Any = None,
        save_optimizer: bool = False,
        consumed_train_samples: int | None = None,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> str:
        """As the transformers backend's; under tp the sharded optimizer state is gathered
        first, with every other rank in :meth:`_join_save`."""
        with self._whole_optimizer_state(adapter_name, save_optimizer):
            return super().save(
                name,
                output_dir=output_dir,
                save_optimizer=save_optimizer,
                consumed_train_samples=consumed_train_samples,
                adapter_name=adapter_name,
                **kwargs,
            )

    def _join_save(self, *args: Any, **kwargs: Any) -> None:
        """``save`` (its arguments) on a tp rank that does not write: its part of the gather of
        the sharded optimizer state."""
        bound = inspect.signature(self.save).bind(*args, **kwargs).arguments
        with self._whole_optimizer_state(
            bound.get("adapter_name"), bool(bound.get("save_optimizer", False))
        ):
            pass

    def _whole_optimizer_state(self, adapter_name: str | None, save_optimizer: bool):
        optimizer = self.tenant(adapter_name).optimizer
        if save_optimizer and isinstance(optimizer, _SHARDED_TYPES):
            return optimizer.gathered()
        return contextlib.nullcontext()


__all__ = ["MultiLoraMegatronModel"]
