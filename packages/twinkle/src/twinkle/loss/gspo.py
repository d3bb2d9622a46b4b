"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"), in Tinker's summed convention.

The importance ratio is taken per sequence: ``s = exp(mean over the ratio mask of (lp - q))``;
the clipped PPO objective is applied to ``s`` instead of to each token's ratio.
"""

from __future__ import annotations

import torch

from twinkle.loss.base import Loss, LossInputs, LossOutput, num_tokens, per_token, require
from twinkle.loss.registry import register_loss


@register_loss("gspo")
class GSPOLoss(Loss):
    """``-sum_t m_t * min(s_t * A_t, clip(s_t, lo, hi) * A_t)`` (GSPO-token, summed per token).

    ``m`` is the ratio mask (``weights``, Tinker's ``sequence_ratio_mask``; the target mask when
    absent) and ``s_t = sg(s) * exp(lp_t - sg(lp_t))``: its value is the row's sequence ratio
    ``s = exp(sum_t m_t (lp_t - q_t) / sum_t m_t)`` and its gradient that of ``s * lp_t``. With
    one advantage per row this is the paper's GSPO gradient, times the row's length (Tinker sums
    over tokens, it never averages).

    Args:
        clip_low_threshold: lower bound ``lo`` on the sequence ratio (paper: ``1 - 3e-4``).
        clip_high_threshold: upper bound ``hi`` on the sequence ratio (paper: ``1 + 4e-4``).
    """

    def __init__(self, clip_low_threshold: float = 1 - 3e-4, clip_high_threshold: float = 1 + 4e-4):
        self.clip_low_threshold = clip_low_threshold
        self.clip_high_threshold = clip_high_threshold

    def __call__(self, inputs: LossInputs) -> LossOutput:
        lp_B_T = inputs.logprobs
        q_B_T = require(inputs, "old_logprobs", self.name)
        adv_B_T = per_token(require(inputs, "advantages", self.name), lp_B_T)
        mask_B_T = inputs.mask if inputs.weights is None else inputs.weights * inputs.mask
        count_B = mask_B_T.sum(dim=-1).clamp(min=1.0)
        log_ratio_B = ((lp_B_T - q_B_T) * mask_B_T).sum(dim=-1) / count_B
        seq_ratio_B_T = torch.exp(log_ratio_B).detach()[:, None] * torch.exp(
            lp_B_T - lp_B_T.detach()
        )
        clipped_B_T = torch.clamp(seq_ratio_B_T, self.clip_low_threshold, self.clip_high_threshold)
        surrogate_B_T = torch.minimum(seq_ratio_B_T * adv_B_T, clipped_B_T * adv_B_T)
        total = -(surrogate_B_T * mask_B_T).sum()
        outside_B = (log_ratio_B.exp() < self.clip_low_threshold) | (
            log_ratio_B.exp() > self.clip_high_threshold
        )
        return LossOutput(
            loss=total,
            num_tokens=num_tokens(mask_B_T),
            metrics={"loss": float(total.detach()), "clip_frac": float(outside_B.float().mean())},
        )
