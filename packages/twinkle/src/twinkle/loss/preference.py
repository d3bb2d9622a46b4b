"""Reference-free preference losses over (chosen, rejected) row pairs: SimPO, CPO and ORPO.

Rows come interleaved as DPO takes them: row ``2i`` is the chosen answer and row ``2i+1`` the
rejected one to the same prompt. None of these runs a reference pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from twinkle.loss.base import (
    Loss,
    LossInputs,
    LossOutput,
    check_pairs,
    masked_mean,
    num_tokens,
    row_means,
    row_sums,
)
from twinkle.loss.registry import register_loss


def _pair_metrics(loss: torch.Tensor, chosen_P: torch.Tensor, rejected_P: torch.Tensor) -> dict:
    margin_P = (chosen_P - rejected_P).detach()
    return {
        "loss": float(loss.detach()),
        "reward_accuracy": float((margin_P > 0).float().mean()),
        "reward_margin": float(margin_P.mean()),
        "chosen_reward": float(chosen_P.detach().mean()),
        "rejected_reward": float(rejected_P.detach().mean()),
    }


def _chosen_nll(inputs: LossInputs) -> torch.Tensor:
    """Mean negative log-likelihood over the chosen rows' tokens."""
    return -masked_mean(inputs.logprobs[0::2], inputs.mask[0::2])


@register_loss("SimPOLoss")
class SimPOLoss(Loss):
    """SimPO (Meng et al. 2024): ``-log sigmoid(beta * (avg_c - avg_r) - gamma)``, mean over
    pairs, with ``avg`` each answer's mean token log-probability (length-normalised reward).

    Args:
        beta: reward scale.
        gamma: target reward margin.
        sft_weight: weight of an added SFT term on the chosen rows (0: none).
    """

    pair_rows = True

    def __init__(self, beta: float = 2.5, gamma: float = 0.5, sft_weight: float = 0.0):
        self.beta, self.gamma, self.sft_weight = beta, gamma, sft_weight

    def __call__(self, inputs: LossInputs) -> LossOutput:
        check_pairs(inputs, self.name)
        avg_B = row_means(inputs.logprobs, inputs.mask)
        chosen_P, rejected_P = self.beta * avg_B[0::2], self.beta * avg_B[1::2]
        loss = -F.logsigmoid(chosen_P - rejected_P - self.gamma).mean()
        if self.sft_weight:
            loss = loss + self.sft_weight * _chosen_nll(inputs)
        return LossOutput(
            loss=loss,
            num_tokens=num_tokens(inputs.mask),
            metrics=_pair_metrics(loss, chosen_P, rejected_P),
        )


@register_loss("CPOLoss")
class CPOLoss(Loss):
    """CPO (Xu et al. 2024): reference-free DPO on summed log-probabilities plus a behaviour-
    cloning (SFT) term on the chosen rows: ``-log sigmoid(beta * (sum_c - sum_r)) + bc_coef *
    NLL(chosen)``.

    Args:
        beta: reward scale.
        bc_coef: weight of the behaviour-cloning term.
    """

    pair_rows = True

    def __init__(self, beta: float = 0.1, bc_coef: float = 1.0):
        self.beta, self.bc_coef = beta, bc_coef

    def __call__(self, inputs: LossInputs) -> LossOutput:
        check_pairs(inputs, self.name)
        sum_B = row_sums(inputs.logprobs, inputs.mask)
        chosen_P, rejected_P = self.beta * sum_B[0::2], self.beta * sum_B[1::2]
        preference = -F.logsigmoid(chosen_P - rejected_P).mean()
        nll = _chosen_nll(inputs)
        loss = preference + self.bc_coef * nll
        metrics = _pair_metrics(loss, chosen_P, rejected_P)
        metrics["nll"] = float(nll.detach())
        return LossOutput(loss=loss, num_tokens=num_tokens(inputs.mask), metrics=metrics)


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, accurate near 0 and far from it (Maechler 2012)."""
    x = x.clamp(max=-1e-7)
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


@register_loss("ORPOLoss")
class ORPOLoss(Loss):
    """ORPO (Hong et al. 2024): SFT on the chosen rows plus ``lambda_orpo`` times
    ``-log sigmoid(log odds_c - log odds_r)``, with ``odds = p / (1 - p)`` of each answer's
    mean token probability ``p``.

    Args:
        lambda_orpo: weight of the odds-ratio term.
    """

    pair_rows = True

    def __init__(self, lambda_orpo: float = 0.1):
        self.lambda_orpo = lambda_orpo

    def __call__(self, inputs: LossInputs) -> LossOutput:
        check_pairs(inputs, self.name)
        avg_B = row_means(inputs.logprobs, inputs.mask)
        log_odds_B = avg_B - _log1mexp(avg_B)
        chosen_P, rejected_P = log_odds_B[0::2], log_odds_B[1::2]
        odds_term = -F.logsigmoid(chosen_P - rejected_P).mean()
        nll = _chosen_nll(inputs)
        loss = nll + self.lambda_orpo * odds_term
        metrics = _pair_metrics(loss, chosen_P, rejected_P)
        metrics.update(
            nll=float(nll.detach()), log_odds_ratio=float((chosen_P - rejected_P).detach().mean())
        )
        return LossOutput(loss=loss, num_tokens=num_tokens(inputs.mask), metrics=metrics)
