"""Token-level cross entropy for SFT and continued pre-training."""

from __future__ import annotations

import torch

from twinkle.loss.base import Loss, LossInputs, LossOutput, num_tokens
from twinkle.loss.registry import register_loss


@register_loss("CrossEntropyLoss")
class CrossEntropyLoss(Loss):
    """Negative log-likelihood of the masked target tokens.

    With ``weights`` the mean is weighted: ``sum(-lp * w * mask) / sum(w * mask)``.

    Args:
        reduction: ``'mean'`` (over counted tokens) or ``'sum'``.

    Raises:
        ValueError: for another reduction.
    """

    def __init__(self, reduction: str = "mean"):
        if reduction not in ("mean", "sum"):
            raise ValueError(
                f"CrossEntropyLoss reduction must be 'mean' or 'sum', got {reduction!r}"
            )
        self.reduction = reduction

    def __call__(self, inputs: LossInputs) -> LossOutput:
        weight_B_T = inputs.mask if inputs.weights is None else inputs.weights * inputs.mask
        total = -(inputs.logprobs * weight_B_T).sum()
        if self.reduction == "mean":
            # clamp: a batch with no target tokens yields 0, not NaN, and still backpropagates.
            total = total / weight_B_T.sum().clamp(min=torch.finfo(total.dtype).tiny)
        return LossOutput(
            loss=total, num_tokens=num_tokens(inputs.mask), metrics={"loss": float(total.detach())}
        )
