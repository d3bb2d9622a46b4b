"""The ``peft`` mode of bench/multi_tenant_train.py: a plain PEFT training loop as a peer would run it.

One ``peft.PeftModel`` on the same base holds every tenant's adapter (same rank, alpha and
``all-linear`` targets as the Twinkle tenants); a step is, for each tenant in turn,
``set_adapter`` + forward with labels (transformers' own shifted cross entropy, mean over the
trained tokens) + backward + ``clip_grad_norm_(1.0)`` + its own torch AdamW step (same
hyper-parameters and ``fused`` flag as Twinkle's tenants) + ``zero_grad``.

With ``gradient_checkpointing=True`` (the ``peft_gc`` mode) the peer is what a Hugging Face + PEFT
user gets from ``gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant":
False})``: every decoder layer keeps only its input and recomputes its activations in backward.
transformers checkpoints only in training mode, so that peer runs in ``train()`` (the tiny models'
attention and LoRA dropout are 0, so the values do not change).

The adapters start from the very weights Twinkle gives the same tenants (Twinkle seeds each
adapter's initialisation per module, so they are regenerated here without a Twinkle model, which
keeps a fresh process measuring this mode's memory free of a second base copy); the losses of
the two loops are then the same numbers, and the comparison is of the same work.
"""

from __future__ import annotations

from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from twinkle.model.lora.inject import PEFT_PREFIX, _adapter_seed, adapter_module_names
from twinkle.model.lora.layer import LoraRouter, MultiLoraLinear
from twinkle.model.lora.spec import adapter_spec_from_config


def default_dtype(device: torch.device) -> torch.dtype:
    """The base weights' dtype Twinkle picks when given none (bf16 on CUDA, fp32 elsewhere)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def twinkle_initial_state(
    base: torch.nn.Module, name: str, config: LoraConfig, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Adapter ``name``'s initial weights as ``MultiLoraTransformersModel(seed=seed)`` creates
    them, under PEFT's saved keys; ``base`` is the plain transformers model (left unchanged)."""
    spec = adapter_spec_from_config(name, config, seed=seed)
    router = LoraRouter()
    state = {}
    for module_name in adapter_module_names(base, spec):
        # A throw-away wrapper around the (shared, unchanged) base linear: its add_adapter is
        # Twinkle's initialisation, fed the same per-module generator as inject_adapter uses.
        layer = MultiLoraLinear(base.get_submodule(module_name), router)
        generator = torch.Generator().manual_seed(_adapter_seed(spec, module_name))
        layer.add_adapter(spec.for_module(module_name), generator)
        for kind in ("lora_A", "lora_B"):
            weight = getattr(layer, kind)[name].weight.detach()
            state[f"{PEFT_PREFIX}{module_name}.{kind}.weight"] = weight
    return state


def enable_gradient_checkpointing(base: torch.nn.Module) -> None:
    """Turn on transformers' non-reentrant activation checkpointing of every decoder layer.

    (Non-reentrant checkpointing needs no ``enable_input_require_grads``: it recomputes a layer
    whether or not the layer's input requires grad; transformers 5 adds that hook anyway.)
    """
    kwargs = {"use_reentrant": False}
    # Recent transformers name it so (gradient_checkpointing_enable: a deprecated alias).
    enable = getattr(base, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class PeftPeer:
    """One ``PeftModel`` holding the tenants ``configs`` names, each with its own AdamW.

    Args:
        model_dir: The base model's directory (Twinkle's ``model.model_dir``).
        configs: ``{tenant: LoraConfig}``, the configs the Twinkle tenants were given (with
            ``target_modules='all-linear'`` set: PEFT has no default for it).
        lr: AdamW's learning rate (the other modes': 1e-4).
        fused: AdamW's ``fused`` flag (the other modes': ``True``).
        device: Where the model lives (CUDA when available unless given, as Twinkle's).
        seed: Twinkle's adapter-initialisation seed, so the weights start equal.
        gradient_checkpointing: Recompute each decoder layer's activations in backward
            (transformers' non-reentrant checkpointing), as the ``peft_gc`` mode runs.
    """

    def __init__(
        self,
        model_dir: str,
        configs: dict[str, LoraConfig],
        lr: float = 1e-4,
        fused: bool = True,
        device: str | torch.device | None = None,
        seed: int = 0,
        gradient_checkpointing: bool = False,
    ) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        base = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=default_dtype(self.device), attn_implementation="sdpa"
        )
        base.requires_grad_(False)
        initial = {n: twinkle_initial_state(base, n, c, seed) for n, c in configs.items()}
        names = list(configs)
        self.model = get_peft_model(base, configs[names[0]], adapter_name=names[0])
        for name in names[1:]:
            self.model.add_adapter(name, configs[name])
        self.model.to(self.device)
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing:
            enable_gradient_checkpointing(base)
            self.model.train()  # transformers checkpoints a layer only in training mode
        else:
            # As Twinkle's base: eval mode (no dropout in the base), gradients only in the adapters.
            self.model.eval()
        self.params = {name: self._load(name, initial[name]) for name in names}
        self.optimizers = {
            name: torch.optim.AdamW(params, lr=lr, fused=fused)
            for name, params in self.params.items()
        }

    def _load(self, name: str, state: dict[str, torch.Tensor]) -> list[torch.nn.Parameter]:
        """Copy ``state`` into adapter ``name``; every key must match. Returns its parameters."""
        params = {}
        for key, param in self.model.named_parameters():
            if f".{name}." in key and ("lora_A" in key or "lora_B" in key):
                params[key.replace(f".{name}.", ".")] = param
        if set(params) != set(state):
            raise ValueError(
                f"PEFT adapter {name!r} and Twinkle's differ: "
                f"{sorted(set(params) ^ set(state))[:3]}"
            )
        with torch.no_grad():
            for key, param in params.items():
                param.copy_(state[key].to(param.dtype))
        return list(params.values())

    def state(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter ``name``'s weights under PEFT's saved keys (for comparisons)."""
        return {
            key.replace(f".{name}.", "."): p.detach()
            for key, p in self.model.named_parameters()
            if f".{name}." in key and ("lora_A" in key or "lora_B" in key)
        }

    def step(self, batches: dict[str, dict[str, torch.Tensor]], max_grad_norm: float = 1.0):
        """One training step of every tenant in ``batches``; returns each tenant's loss."""
        losses = {}
        for name, batch in batches.items():
            losses[name] = self.forward_backward(name, batch)
            torch.nn.utils.clip_grad_norm_(self.params[name], max_grad_norm)
            self.optimizers[name].step()
            self.optimizers[name].zero_grad(set_to_none=True)
        return losses

    def forward_backward(self, name: str, batch: dict[str, torch.Tensor]) -> float:
        """``set_adapter`` + forward with labels + backward; returns the loss."""
        self.model.set_adapter(name)
        inputs: dict[str, Any] = {k: v.to(self.device) for k, v in batch.items()}
        loss = self.model(**inputs).loss
        loss.backward()
        return float(loss.detach())
