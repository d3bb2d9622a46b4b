"""GRPO: clipped policy-gradient surrogate with group-normalised advantages and optional KL."""

from __future__ import annotations

import torch

from twinkle.errors import InvalidArgumentError
from twinkle.loss.base import Loss, LossInputs, LossOutput, num_tokens, per_token, require
from twinkle.loss.registry import register_loss

_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")


@register_loss("GRPOLoss")
class GRPOLoss(Loss):
    """Clipped surrogate ``-min(r*A, clip(r, 1-eps, 1+eps_high)*A)`` plus ``beta * KL``.

    ``r = exp(lp - old)``; without ``old_logprobs`` the rollout is on-policy, so ``old`` is
    ``lp.detach()`` (ratio 1, gradient ``A``). The KL is the k3 estimator
    ``exp(ref - lp) - (ref - lp) - 1`` against the reference model.

    Args:
        epsilon: lower clip range.
        epsilon_high: upper clip range (DAPO's clip-higher); defaults to ``epsilon``.
        beta: KL coefficient; when > 0 the loss needs reference log-probabilities.
        loss_type: ``'grpo'`` (mean per sequence, then over sequences), ``'bnpo'`` (mean over all
            tokens) or ``'dr_grpo'`` (sum divided by ``B * T``, no length bias).

    Raises:
        ValueError: for an unknown loss_type.
    """

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        loss_type: str = "grpo",
    ):
        if loss_type not in _LOSS_TYPES:
            raise InvalidArgumentError(
                f"GRPOLoss loss_type must be one of {_LOSS_TYPES}, got {loss_type!r}"
            )
        self.epsilon = epsilon
        self.epsilon_high = epsilon if epsilon_high is None else epsilon_high
        self.beta = beta
        self.loss_type = loss_type
        self.needs_reference = beta > 0

    def __call__(self, inputs: LossInputs) -> LossOutput:
        lp_B_T, mask_B_T = inputs.logprobs, inputs.mask
        adv_B_T = per_token(require(inputs, "advantages", self.name), lp_B_T)
        old_B_T = lp_B_T.detach() if inputs.old_logprobs is None else inputs.old_logprobs
        ratio_B_T = torch.exp(lp_B_T - old_B_T)
        token_loss_B_T = self._token_loss(ratio_B_T, adv_B_T)
        kl_B_T = None
        if self.beta > 0:
            delta_B_T = require(inputs, "ref_logprobs", self.name) - lp_B_T
            kl_B_T = torch.exp(delta_B_T) - delta_B_T - 1
            token_loss_B_T = token_loss_B_T + self.beta * kl_B_T
        loss = self._reduce(token_loss_B_T, mask_B_T)
        return LossOutput(
            loss=loss,
            num_tokens=num_tokens(mask_B_T),
            metrics=self._metrics(loss, ratio_B_T, adv_B_T, mask_B_T, kl_B_T),
        )

    def _token_loss(self, ratio_B_T: torch.Tensor, adv_B_T: torch.Tensor) -> torch.Tensor:
        """The per-token policy term; subclasses change how the ratio is limited."""
        clipped_B_T = torch.clamp(ratio_B_T, 1 - self.epsilon, 1 + self.epsilon_high)
        return -torch.minimum(ratio_B_T * adv_B_T, clipped_B_T * adv_B_T)

    def _reduce(self, token_loss_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
        masked_B_T = token_loss_B_T * mask_B_T
        if self.loss_type == "grpo":
            per_seq_B = masked_B_T.sum(-1) / mask_B_T.sum(-1).clamp(min=1.0)
            return per_seq_B.mean()
        if self.loss_type == "bnpo":
            return masked_B_T.sum() / mask_B_T.sum().clamp(min=1.0)
        length = getattr(self, "max_completion_length", None) or mask_B_T.shape[1]
        return masked_B_T.sum() / (mask_B_T.shape[0] * length)

    def _metrics(self, loss, ratio_B_T, adv_B_T, mask_B_T, kl_B_T) -> dict[str, float]:
        def masked_mean(values_B_T: torch.Tensor) -> float:
            return float((values_B_T.detach() * mask_B_T).sum() / mask_B_T.sum().clamp(min=1.0))

        # A token counts as clipped only where the clipped branch wins the min, i.e. where
        # clipping actually removed its gradient.
        low_B_T = (ratio_B_T < 1 - self.epsilon) & (adv_B_T < 0)
        high_B_T = (ratio_B_T > 1 + self.epsilon_high) & (adv_B_T > 0)
        metrics = {
            "loss": float(loss.detach()),
            "clip_frac": masked_mean((low_B_T | high_B_T).to(mask_B_T.dtype)),
            "ratio_mean": masked_mean(ratio_B_T),
        }
        if kl_B_T is not None:
            metrics["kl"] = masked_mean(kl_B_T)
        return metrics


@register_loss("BNPOLoss")
class BNPOLoss(GRPOLoss):
    """GRPO averaged over all the batch's tokens at once (``loss_type='bnpo'``): long answers
    weigh more than in GRPO's per-sequence mean.

    Args:
        epsilon: lower clip range.
        epsilon_high: upper clip range; defaults to ``epsilon``.
        beta: KL coefficient (needs reference log-probabilities when > 0).
    """

    def __init__(self, epsilon: float = 0.2, epsilon_high: float | None = None, beta: float = 0.0):
        super().__init__(epsilon=epsilon, epsilon_high=epsilon_high, beta=beta, loss_type="bnpo")


@register_loss("DRGRPOLoss")
class DRGRPOLoss(GRPOLoss):
    """Dr. GRPO: the summed token loss divided by a constant ``B * max_completion_length``, so
    neither the answer's length nor the batch's padding rescales a token's gradient.

    Args:
        epsilon: lower clip range.
        epsilon_high: upper clip range; defaults to ``epsilon``.
        beta: KL coefficient (needs reference log-probabilities when > 0).
        max_completion_length: the constant length; ``None`` takes the batch's padded length.
    """

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        max_completion_length: int | None = 1024,
    ):
        if max_completion_length is not None and max_completion_length < 1:
            raise InvalidArgumentError(
                f"DRGRPOLoss max_completion_length must be >= 1, got {max_completion_length}"
            )
        super().__init__(epsilon=epsilon, epsilon_high=epsilon_high, beta=beta, loss_type="dr_grpo")
        self.max_completion_length = max_completion_length


@register_loss("SAPOLoss")
class SAPOLoss(GRPOLoss):
    """GRPO with a soft gate instead of the hard clip: ``-g(r) * A`` per token with
    ``g(r) = sigmoid(tau * (r - 1)) * 4 / tau`` (``tau_pos`` where ``A > 0``, else ``tau_neg``).

    The gate's slope is 1 at ``r = 1`` (on-policy it is the plain policy gradient) and fades
    smoothly as the ratio moves away, rather than dropping to 0 at a threshold.

    Args:
        tau_pos: gate temperature for positive advantages (larger: narrower trust region).
        tau_neg: gate temperature for negative advantages.
        beta: KL coefficient (needs reference log-probabilities when > 0).
        epsilon: only reported: tokens outside ``[1 - epsilon, 1 + epsilon]`` count in
            ``clip_frac``.

    Raises:
        InvalidArgumentError: a temperature <= 0.
    """

    def __init__(
        self,
        tau_pos: float = 1.0,
        tau_neg: float = 1.0,
        beta: float = 0.0,
        epsilon: float = 0.2,
    ):
        if tau_pos <= 0 or tau_neg <= 0:
            raise InvalidArgumentError(
                f"SAPOLoss tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}"
            )
        super().__init__(epsilon=epsilon, beta=beta)
        self.tau_pos = tau_pos
        self.tau_neg = tau_neg

    def _token_loss(self, ratio_B_T: torch.Tensor, adv_B_T: torch.Tensor) -> torch.Tensor:
        tau_B_T = torch.where(
            adv_B_T > 0,
            torch.full_like(ratio_B_T, self.tau_pos),
            torch.full_like(ratio_B_T, self.tau_neg),
        )
        gate_B_T = torch.sigmoid(tau_B_T * (ratio_B_T - 1)) * (4.0 / tau_B_T)
        return -gate_B_T * adv_B_T
