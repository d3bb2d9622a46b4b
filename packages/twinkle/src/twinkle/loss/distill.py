"""Distillation: GKD's generalised Jensen-Shannon divergence to a teacher's top-k distribution,
and a squared-error regression of the policy's token log-probabilities.

A tenant sends the teacher over the wire as, per row and per token position, the log-probs of
its ``K`` most likely tokens (``teacher_topk_logprobs``) and their ids
(``teacher_topk_indices``), as a vLLM ``prompt_logprobs`` call returns them; the model gathers
its own logits at those ids into ``topk_logits``. Full-vocabulary teacher logits are accepted
in-process only (``teacher_logits``, optionally reduced with ``topk``): over HTTP they would be
``T x V`` floats per row.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from twinkle.errors import InvalidArgumentError
from twinkle.loss.base import Loss, LossInputs, LossOutput, masked_mean, num_tokens, require
from twinkle.loss.registry import register_loss


@register_loss("GKDLoss")
class GKDLoss(Loss):
    """Generalised JSD (Agarwal et al. 2024, on-policy distillation) per token over the teacher's
    candidates, averaged over the trained tokens.

    Both sides are renormalised over the ``K`` candidates after dividing by ``temperature``:
    ``S = softmax(student / t)``, ``T = softmax(teacher / t)`` and
    ``JSD_b = b * KL(T || M) + (1 - b) * KL(S || M)`` with ``M = b * T + (1 - b) * S``.
    ``beta = 0`` is the forward ``KL(T || S)``, ``beta = 1`` the reverse ``KL(S || T)``.

    Args:
        beta: mixture weight of the teacher, in ``[0, 1]``.
        temperature: softmax temperature of both sides.

    Raises:
        InvalidArgumentError: beta outside ``[0, 1]`` or a temperature <= 0.
    """

    def __init__(self, beta: float = 0.5, temperature: float = 1.0):
        if not 0.0 <= beta <= 1.0:
            raise InvalidArgumentError(f"GKDLoss beta must lie in [0, 1], got {beta}")
        if temperature <= 0:
            raise InvalidArgumentError(f"GKDLoss temperature must be > 0, got {temperature}")
        self.beta, self.temperature = beta, temperature

    def __call__(self, inputs: LossInputs) -> LossOutput:
        teacher_B_T_K = require(inputs, "teacher_topk_logprobs", self.name)
        student_B_T_K = require(inputs, "topk_logits", self.name)
        s_B_T_K = F.log_softmax(student_B_T_K.float() / self.temperature, dim=-1)
        t_B_T_K = F.log_softmax(teacher_B_T_K.float() / self.temperature, dim=-1)
        div_B_T = self._divergence(s_B_T_K, t_B_T_K)
        loss = masked_mean(div_B_T, inputs.mask)
        return LossOutput(
            loss=loss, num_tokens=num_tokens(inputs.mask), metrics={"loss": float(loss.detach())}
        )

    def _divergence(self, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.beta == 0.0:
            return _kl(t, s)
        if self.beta == 1.0:
            return _kl(s, t)
        m = torch.logsumexp(
            torch.stack([s + math.log(1 - self.beta), t + math.log(self.beta)]), dim=0
        )
        return self.beta * _kl(t, m) + (1 - self.beta) * _kl(s, m)


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """``KL(P || Q)`` over the last dimension, from log-probabilities."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)


@register_loss("MSELoss")
class MSELoss(Loss):
    """Squared error between the policy's target log-probabilities and per-token
    ``target_values`` (for instance a teacher's log-probs of the same tokens), averaged over the
    trained tokens."""

    def __call__(self, inputs: LossInputs) -> LossOutput:
        target_B_T = require(inputs, "target_values", self.name)
        loss = masked_mean((inputs.logprobs - target_B_T) ** 2, inputs.mask)
        return LossOutput(
            loss=loss, num_tokens=num_tokens(inputs.mask), metrics={"loss": float(loss.detach())}
        )
