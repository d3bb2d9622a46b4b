"""The transformers backend's model: the tenant engine over a base model from transformers."""

from __future__ import annotations

from typing import Any

import torch

from twinkle.hub import remote_code_guard, resolve_model_dir
from twinkle.model.engine import BaseModel, TenantEngine
from twinkle.model.lora import LoraRouter
from twinkle.model.memory import apply_process_options
from twinkle.model.options import ExecutionOptions, resolve_options
from twinkle.model.transformers._auto import auto_model_class
from twinkle.model.transformers.lean import make_lean
from twinkle.model.transformers.recompute import install_recompute


def build_base(
    model_id: str,
    torch_dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    options: ExecutionOptions | dict[str, Any] | None = None,
    **model_kwargs: Any,
) -> BaseModel:
    """Load ``model_id`` with transformers, frozen, with a LoRA router (and, unless
    ``activation_recompute`` is ``off``, decoder layers that recompute where a pass asks)."""
    options = resolve_options(options)
    apply_process_options(options)  # as a server replica runs (twinkle.model.memory)
    model_dir = resolve_model_dir(model_id)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch_dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    with remote_code_guard(model_dir) as trust:
        module = (
            auto_model_class(model_dir, trust)
            .from_pretrained(
                model_dir,
                dtype=dtype,
                attn_implementation=attn_implementation,
                trust_remote_code=trust,
                **model_kwargs,
            )
            .to(device)
        )
    module.requires_grad_(False)
    module.eval()  # dropout lives in the adapters; the base model is frozen
    if options.lean_activations:
        make_lean(module)
    router = LoraRouter(kernel=options.lora_kernel)
    recompute = install_recompute(module, router) if options.activation_recompute != "off" else None
    return BaseModel(model_id, model_dir, device, module, router, options, recompute)


class MultiLoraTransformersModel(TenantEngine):
    """A frozen transformers model shared by many tenants, each training its own LoRA adapter
    (the API: :class:`~twinkle.model.engine.TenantEngine`).

    Every method takes ``adapter_name=``; when exactly one adapter exists it is the default.
    Tenants are isolated: one tenant's calls never change another tenant's weights, optimizer
    state, loss, template or progress.

    Args:
        model_id: ``tiny://qwen3.5``, ``ms://org/name``, ``hf://org/name`` or a local directory.
        torch_dtype: Weights dtype of the base model (float32 by default on CPU).
        device: Torch device; CUDA when available unless given.
        attn_implementation: Passed to transformers (``sdpa`` by default).
        seed: Seed for adapter initialisation.
        options: How passes execute (``ExecutionOptions`` or a mapping of its fields; default:
            the environment's defaults). Read once, here.
    """

    def __init__(
        self,
        model_id: str,
        torch_dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        attn_implementation: str = "sdpa",
        seed: int = 0,
        options: ExecutionOptions | dict[str, Any] | None = None,
        **model_kwargs: Any,
    ) -> None:
        base = build_base(
            model_id, torch_dtype, device, attn_implementation, options, **model_kwargs
        )
        super().__init__(base, seed=seed)


__all__ = ["MultiLoraTransformersModel", "build_base"]
