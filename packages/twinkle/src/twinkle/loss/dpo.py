"""DPO and its IPO/hinge variants over (chosen, rejected) row pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twinkle.loss.base import Loss, LossInputs, LossOutput, num_tokens, require
from twinkle.loss.registry import register_loss

_LOSS_TYPES = ("sigmoid", "ipo", "hinge")


@register_loss("DPOLoss")
class DPOLoss(Loss):
    """Direct preference optimisation; row ``2i`` is chosen and row ``2i+1`` rejected.

    ``logits = beta * ((pc - rc) - (pr - rr))`` over summed sequence log-probabilities of the
    policy (p) and reference (r) for chosen (c) and rejected (r) rows; the loss is the mean over
    pairs plus ``sft_weight`` times the mean cross entropy over the chosen rows' tokens.

    Args:
        beta: temperature of the implicit reward.
        loss_type: ``'sigmoid'`` (DPO), ``'ipo'`` or ``'hinge'``.
        sft_weight: weight of the auxiliary SFT term on chosen rows.
        label_smoothing: conservative-DPO smoothing (sigmoid only).

    Raises:
        ValueError: for an unknown loss_type.
    """

    needs_reference = True

    def __init__(
        self,
        beta: float = 0.1,
        loss_type: str = "sigmoid",
        sft_weight: float = 0.0,
        label_smoothing: float = 0.0,
    ):
        if loss_type not in _LOSS_TYPES:
            raise ValueError(f"DPOLoss loss_type must be one of {_LOSS_TYPES}, got {loss_type!r}")
        self.beta = beta
        self.loss_type = loss_type
        self.sft_weight = sft_weight
        self.label_smoothing = label_smoothing

    def __call__(self, inputs: LossInputs) -> LossOutput:
        lp_B_T, mask_B_T = inputs.logprobs, inputs.mask
        ref_B_T = require(inputs, "ref_logprobs", self.name)
        if lp_B_T.shape[0] % 2:
            raise ValueError(
                f"DPOLoss needs (chosen, rejected) row pairs, got an odd batch of {lp_B_T.shape[0]}"
            )
        policy_B = (lp_B_T * mask_B_T).sum(-1)
        ref_B = (ref_B_T * mask_B_T).sum(-1)
        chosen_reward_P = self.beta * (policy_B[0::2] - ref_B[0::2])
        rejected_reward_P = self.beta * (policy_B[1::2] - ref_B[1::2])
        logits_P = chosen_reward_P - rejected_reward_P
        loss = self._pair_loss(logits_P).mean()
        if self.sft_weight:
            chosen_mask = mask_B_T[0::2]
            sft = -(lp_B_T[0::2] * chosen_mask).sum() / chosen_mask.sum().clamp(min=1.0)
            loss = loss + self.sft_weight * sft
        margins_P = (chosen_reward_P - rejected_reward_P).detach()
        return LossOutput(
            loss=loss,
            num_tokens=num_tokens(mask_B_T),
            metrics={
                "loss": float(loss.detach()),
                "reward_accuracy": float((margins_P > 0).float().mean()),
                "reward_margin": float(margins_P.mean()),
                "chosen_reward": float(chosen_reward_P.detach().mean()),
                "rejected_reward": float(rejected_reward_P.detach().mean()),
            },
        )

    def _pair_loss(self, logits_P: torch.Tensor) -> torch.Tensor:
        if self.loss_type == "sigmoid":
            ls = self.label_smoothing
            return -(1 - ls) * F.logsigmoid(logits_P) - ls * F.logsigmoid(-logits_P)
        if self.loss_type == "ipo":
            return (logits_P / self.beta - 1 / (2 * self.beta)) ** 2
        return torch.relu(1 - logits_P)
