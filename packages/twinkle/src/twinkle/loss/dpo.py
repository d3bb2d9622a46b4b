"""DPO and its IPO/hinge variants over (chosen, rejected) row pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twinkle.errors import InvalidArgumentError
from twinkle.loss.base import Loss, LossInputs, LossOutput, check_pairs, num_tokens, require
from twinkle.loss.registry import register_loss

_LOSS_TYPES = ("sigmoid", "ipo", "hinge", "kto_pair")


@register_loss("DPOLoss")
class DPOLoss(Loss):
    """Direct preference optimisation; row ``2i`` is chosen and row ``2i+1`` rejected.

    ``logits = beta * ((pc - rc) - (pr - rr))`` over summed sequence log-probabilities of the
    policy (p) and reference (r) for chosen (c) and rejected (r) rows; the loss is the mean over
    pairs plus ``sft_weight`` times the mean cross entropy over the chosen rows' tokens.

    The reference log-probabilities come, in this order, from the request (``ref_logprobs``, or
    ``ref_outputs`` from ``forward_only(disable_lora=True)``) or from a pass of the base model
    with the adapter disabled that the step runs itself. ``reference_free=True`` takes the
    reference as 0 and runs no reference pass.

    Args:
        beta: temperature of the implicit reward.
        loss_type: ``'sigmoid'`` (DPO), ``'ipo'``, ``'hinge'`` or ``'kto_pair'``.
        sft_weight: weight of the auxiliary SFT term on chosen rows.
        label_smoothing: conservative-DPO smoothing (sigmoid only).
        reference_free: no reference model: the implicit reward is the policy's own
            log-probability.

    Raises:
        InvalidArgumentError: for an unknown loss_type, or smoothing with another loss_type.
    """

    pair_rows = True

    def __init__(
        self,
        beta: float = 0.1,
        loss_type: str = "sigmoid",
        sft_weight: float = 0.0,
        label_smoothing: float = 0.0,
        reference_free: bool = False,
    ):
        if loss_type not in _LOSS_TYPES:
            raise InvalidArgumentError(
                f"DPOLoss loss_type must be one of {_LOSS_TYPES}, got {loss_type!r}"
            )
        if label_smoothing and loss_type != "sigmoid":
            raise InvalidArgumentError(
                f"DPOLoss label_smoothing applies to loss_type='sigmoid' only, got {loss_type!r}"
            )
        self.beta = beta
        self.loss_type = loss_type
        self.sft_weight = sft_weight
        self.label_smoothing = label_smoothing
        self.reference_free = bool(reference_free)
        self.needs_reference = not self.reference_free

    def __call__(self, inputs: LossInputs) -> LossOutput:
        lp_B_T, mask_B_T = inputs.logprobs, inputs.mask
        check_pairs(inputs, self.name)
        policy_B = (lp_B_T * mask_B_T).sum(-1)
        if self.reference_free:
            ref_B = torch.zeros_like(policy_B)
        else:
            ref_B = (require(inputs, "ref_logprobs", self.name) * mask_B_T).sum(-1)
        chosen_reward_P = self.beta * (policy_B[0::2] - ref_B[0::2])
        rejected_reward_P = self.beta * (policy_B[1::2] - ref_B[1::2])
        logits_P = chosen_reward_P - rejected_reward_P
        loss = self._pair_loss(logits_P, chosen_reward_P, rejected_reward_P).mean()
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

    def _pair_loss(
        self, logits_P: torch.Tensor, chosen_P: torch.Tensor, rejected_P: torch.Tensor
    ) -> torch.Tensor:
        if self.loss_type == "sigmoid":
            ls = self.label_smoothing
            return -(1 - ls) * F.logsigmoid(logits_P) - ls * F.logsigmoid(-logits_P)
        if self.loss_type == "ipo":
            return (logits_P / self.beta - 1 / (2 * self.beta)) ** 2
        if self.loss_type == "kto_pair":
            # Each side against a zero reward point instead of against each other.
            return (1 - torch.sigmoid(chosen_P)) + torch.sigmoid(rejected_P)
        return torch.relu(1 - logits_P)
