"""Tinker's token losses (``loss_fn`` names), exactly as the Tinker protocol defines them.

Each is per token and SUMMED over all tokens and rows with no normalisation; ``r = exp(lp - q)``
with ``q`` the sampler's log-probabilities (``old_logprobs``). Padding is excluded via ``mask``.
"""

from __future__ import annotations

import torch

from twinkle.loss.base import Loss, LossInputs, LossOutput, num_tokens, per_token, require
from twinkle.loss.registry import register_loss


def _output(token_loss_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> LossOutput:
    total = (token_loss_B_T * mask_B_T).sum()
    return LossOutput(
        loss=total, num_tokens=num_tokens(mask_B_T), metrics={"loss": float(total.detach())}
    )


class _RatioLoss(Loss):
    """Shared input handling of the losses built on ``r = exp(lp - q)`` and advantages."""

    def _ratio_and_advantages(self, inputs: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
        q_B_T = require(inputs, "old_logprobs", self.name)
        adv_B_T = per_token(require(inputs, "advantages", self.name), inputs.logprobs)
        return torch.exp(inputs.logprobs - q_B_T), adv_B_T


@register_loss("cross_entropy")
class TinkerCrossEntropyLoss(Loss):
    """``-(lp * w)`` summed, with ``w = weights`` (or ``mask`` when no weights are given)."""

    def __call__(self, inputs: LossInputs) -> LossOutput:
        weight_B_T = inputs.mask if inputs.weights is None else inputs.weights
        total = -(inputs.logprobs * weight_B_T).sum()
        return LossOutput(
            loss=total, num_tokens=num_tokens(inputs.mask), metrics={"loss": float(total.detach())}
        )


@register_loss("importance_sampling")
class ImportanceSamplingLoss(_RatioLoss):
    """``-r * A`` summed: the off-policy-corrected REINFORCE objective."""

    def __call__(self, inputs: LossInputs) -> LossOutput:
        ratio_B_T, adv_B_T = self._ratio_and_advantages(inputs)
        return _output(-ratio_B_T * adv_B_T, inputs.mask)


class _ClippedLoss(_RatioLoss):
    """Holds the clip thresholds shared by ``ppo`` and ``cispo``.

    Args:
        clip_low_threshold: lower bound ``lo`` on the ratio.
        clip_high_threshold: upper bound ``hi`` on the ratio.
    """

    def __init__(self, clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2):
        self.clip_low_threshold = clip_low_threshold
        self.clip_high_threshold = clip_high_threshold

    def _clip(self, ratio_B_T: torch.Tensor) -> torch.Tensor:
        return torch.clamp(ratio_B_T, self.clip_low_threshold, self.clip_high_threshold)


@register_loss("ppo")
class PPOLoss(_ClippedLoss):
    """``-min(r*A, clip(r, lo, hi)*A)`` summed."""

    def __call__(self, inputs: LossInputs) -> LossOutput:
        ratio_B_T, adv_B_T = self._ratio_and_advantages(inputs)
        surrogate_B_T = torch.minimum(ratio_B_T * adv_B_T, self._clip(ratio_B_T) * adv_B_T)
        return _output(-surrogate_B_T, inputs.mask)


@register_loss("cispo")
class CISPOLoss(_ClippedLoss):
    """``-stopgrad(clip(r, lo, hi)) * lp * A`` summed: clipping weights, never drops, gradients."""

    def __call__(self, inputs: LossInputs) -> LossOutput:
        ratio_B_T, adv_B_T = self._ratio_and_advantages(inputs)
        weight_B_T = self._clip(ratio_B_T).detach()
        return _output(-weight_B_T * inputs.logprobs * adv_B_T, inputs.mask)


@register_loss("dro")
class DROLoss(Loss):
    """``-(lp*A - 0.5*beta*(lp - q)^2)`` summed.

    Args:
        beta: weight of the quadratic penalty keeping the policy near the sampler; required.

    Raises:
        ValueError: when beta is not given.
    """

    def __init__(self, beta: float | None = None):
        if beta is None:
            raise ValueError("loss 'dro' requires the config value 'beta', which is missing")
        self.beta = beta

    def __call__(self, inputs: LossInputs) -> LossOutput:
        lp_B_T = inputs.logprobs
        q_B_T = require(inputs, "old_logprobs", self.name)
        adv_B_T = per_token(require(inputs, "advantages", self.name), lp_B_T)
        token_loss_B_T = -(lp_B_T * adv_B_T - 0.5 * self.beta * (lp_B_T - q_B_T) ** 2)
        return _output(token_loss_B_T, inputs.mask)
