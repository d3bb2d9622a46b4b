"""StableReinforce: REINFORCE with truncated importance weights against the sampler's logprobs.

The sampler's own per-token logprobs (recorded at sampling time, ``record_stability_info``)
correct for the gap between the sampler and the trained policy, in Tinker's summed convention.
"""

from __future__ import annotations

import torch

from twinkle.loss.base import Loss, LossInputs, LossOutput, num_tokens, per_token, require
from twinkle.loss.registry import register_loss


@register_loss("stable_reinforce")
class StableReinforceLoss(Loss):
    """``sum_t m_t * (-sg(min(exp(lp_t - q_t), C)) * A_t * lp_t + kl_coeff * k3_t)``.

    ``q`` are the sampler's logprobs (``old_logprobs``), ``m`` the sampled-token mask
    (``weights``; the target mask when absent) and ``k3_t = exp(q_t - lp_t) - (q_t - lp_t) - 1``,
    the non-negative estimator of the KL between sampler and policy (zero when they agree).
    The truncated weight is constant for the gradient, so each sampled token gets
    ``-min(r, C) * A * grad lp``: REINFORCE corrected off-policy, its variance bounded by ``C``.

    Args:
        clip_high_threshold: the truncation cap ``C`` on the importance weight.
        kl_coeff: weight of the KL penalty to the sampler.
    """

    def __init__(self, clip_high_threshold: float = 2.0, kl_coeff: float = 0.0):
        if clip_high_threshold <= 0:
            raise ValueError("stable_reinforce needs clip_high_threshold > 0")
        self.clip_high_threshold = clip_high_threshold
        self.kl_coeff = kl_coeff

    def __call__(self, inputs: LossInputs) -> LossOutput:
        lp_B_T = inputs.logprobs
        q_B_T = require(inputs, "old_logprobs", self.name)
        adv_B_T = per_token(require(inputs, "advantages", self.name), lp_B_T)
        mask_B_T = inputs.mask if inputs.weights is None else inputs.weights * inputs.mask
        ratio_B_T = torch.exp(lp_B_T - q_B_T)
        weight_B_T = torch.clamp(ratio_B_T, max=self.clip_high_threshold).detach()
        delta_B_T = q_B_T - lp_B_T
        kl_B_T = torch.exp(delta_B_T) - delta_B_T - 1.0
        token_loss_B_T = -weight_B_T * adv_B_T * lp_B_T + self.kl_coeff * kl_B_T
        total = (token_loss_B_T * mask_B_T).sum()
        count = mask_B_T.sum().clamp(min=1.0)
        truncated = ((ratio_B_T > self.clip_high_threshold).float() * mask_B_T).sum() / count
        return LossOutput(
            loss=total,
            num_tokens=num_tokens(mask_B_T),
            metrics={
                "loss": float(total.detach()),
                "kl": float(((kl_B_T * mask_B_T).sum() / count).detach()),
                "truncated_frac": float(truncated.detach()),
            },
        )
