"""Weight gradients outside autograd: what a multi-LoRA backward does in a direct pass.

With the weights as autograd inputs, every layer call costs autograd an edge and an
``AccumulateGrad`` node per weight (two per tenant). In a direct pass the op takes one shared
``anchor`` in place of the weights: a leaf that requires grad, so that outputs require grad even
where ``x`` does not. Its backward then adds every weight's gradient with one ``_foreach_add_``,
the same ``grad += new`` that ``AccumulateGrad`` does, so the gradients are bit for bit the same.

The caller owns the anchor (``LoraRouter.direct_weight_grads`` makes one per device for a pass)
and the contract: before the forward, every routed weight has a ``.grad`` to add to (a tenant's
flat gradient buffer) and no gradient hooks, and the graph is only ever backpropagated with a
plain ``.backward()`` (``torch.autograd.grad`` with respect to the weights sees nothing, and must
not be used on it).
"""

from __future__ import annotations

import torch

from twinkle.model import torch_compat


def new_anchor(device: torch.device) -> torch.Tensor:
    """A fresh anchor on ``device``: empty, a leaf, requires grad (it never gets a gradient)."""
    return torch.empty(0, device=device, requires_grad=True)


def weight_inputs(
    weights: tuple[torch.Tensor, ...], anchor: torch.Tensor | None
) -> tuple[bool, tuple[torch.Tensor, ...]]:
    """``(direct, inputs)`` for a multi-LoRA autograd function (torch or Triton kernel).

    With an ``anchor`` and grad enabled, ``(True, (anchor,))``: backward adds the weight
    gradients itself (:func:`add_weight_grads`). Otherwise ``(False, weights)``, for autograd to
    accumulate; under ``no_grad`` there is no graph, so nothing would be added anyway.
    """
    if anchor is None or not torch.is_grad_enabled():
        return False, weights
    return True, (anchor,)


def add_weight_grads(weights: tuple[torch.Tensor, ...], grads: list) -> None:
    """``w.grad += g`` for every weight and gradient, with one ``_foreach_add_``: what a direct
    backward does instead of autograd's ``AccumulateGrad``.

    Raises:
        RuntimeError: A weight has no ``.grad`` to add to.
    """
    targets = [w.grad for w in weights]
    if any(t is None for t in targets):
        raise RuntimeError(
            "direct weight gradients: a LoRA weight has no .grad to add its gradient to; attach "
            "the gradient buffers before the forward (see LoraRouter.direct_weight_grads)"
        )
    torch_compat.foreach_add_(targets, grads)
