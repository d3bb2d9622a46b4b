"""Activation recompute per decoder layer, for the fused step's training passes.

Without it a training pass keeps every layer's activations for the backward (about 34 hidden-size
values per token and layer). With it each decoder layer keeps only its input and runs its forward
again in the backward (``torch.utils.checkpoint``, non-reentrant): one layer's activations live
at a time, for about a third more compute.

Fused passes route rows to adapters through the model's :class:`~twinkle.model.lora.LoraRouter`,
whose state is set for the forward only. The recomputed forward runs in the backward, after that
state is gone, so each layer call takes a snapshot of it and the recompute restores it: every row
goes through the same adapter, vision route and direct-gradient anchor again. The checkpoint also
restores the RNG state, so LoRA dropout draws the same masks. Results are bit-identical to a pass
without recompute.

:func:`install_recompute` wraps the decoder layers of ONE model instance (their ``forward``); the
returned :class:`LayerRecompute` switches it on for the passes that ask (``enabled``). Passes
without gradients never recompute.
"""

from __future__ import annotations

import functools
import types
from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint

from twinkle.model.lora import LoraRouter


class LayerRecompute:
    """The switch of one model's recomputed decoder layers.

    Attributes:
        layers: Qualified names of the wrapped layers.
        active: Whether layer calls with gradients recompute now (see :meth:`enabled`).
    """

    def __init__(self, router: LoraRouter, layers: list[str]) -> None:
        self.router = router
        self.layers = layers
        self.active = False

    @contextmanager
    def enabled(self, on: bool = True):
        """Recompute in the passes inside the block when ``on``."""
        previous, self.active = self.active, on
        try:
            yield
        finally:
            self.active = previous


def install_recompute(model: torch.nn.Module, router: LoraRouter) -> LayerRecompute:
    """Wrap ``model``'s decoder layers (in place); off until :meth:`LayerRecompute.enabled`.

    A decoder layer is a module whose class name ends in ``DecoderLayer`` (every transformers
    causal LM: Qwen3, Qwen3-MoE, Qwen3.5 and its VL model's language layers). The vision tower's
    blocks are left alone: their activations are per image patch, not per text token.
    """
    control = LayerRecompute(router, [])
    for name, module in model.named_modules():
        if type(module).__name__.endswith("DecoderLayer"):
            plain = module.forward
            module.forward = types.MethodType(_recomputed(plain, control), module)
            control.layers.append(name)
    return control


def _recomputed(plain, control: LayerRecompute):
    @functools.wraps(plain)
    def forward(self, *args, **kwargs):
        if not (control.active and torch.is_grad_enabled()):
            return plain(*args, **kwargs)
        state = control.router.snapshot()

        def run(*a, **k):
            with control.router.restored(state):
                return plain(*a, **k)

        return checkpoint(run, *args, use_reentrant=False, **kwargs)

    return forward


__all__ = ["LayerRecompute", "install_recompute"]
