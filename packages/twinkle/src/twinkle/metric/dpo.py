"""DPO metrics over (chosen, rejected) row pairs: log-probs, implicit rewards, accuracy."""

from __future__ import annotations

import numpy as np

from twinkle.errors import InvalidArgumentError
from twinkle.metric.base import Metric, MetricInputs
from twinkle.metric.registry import register_metric

_SUMS = ("chosen", "rejected", "ref_chosen", "ref_rejected", "reward_chosen", "reward_rejected")


@register_metric("DPOMetric")
class DPOMetric(Metric):
    """Preference metrics; row ``2i`` is chosen and row ``2i+1`` rejected (as ``DPOLoss``).

    A sequence's log-prob is the sum over its trained tokens; the implicit reward is
    ``beta * (policy - reference)``. Keys (means over pairs): ``logps/chosen``,
    ``logps/rejected``; with reference log-probs also ``logps/ref_chosen``,
    ``logps/ref_rejected``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``
    (chosen minus rejected reward) and ``rewards/accuracies`` (share of pairs whose margin is
    > 0, in ``[0, 1]``).

    Args:
        beta: DPO's beta (use the loss's).
        ignore_index: Accepted for upstream compatibility; the mask already leaves those out.
    """

    def __init__(self, beta: float = 0.1, ignore_index: int = -100) -> None:
        self.beta, self.ignore_index = float(beta), ignore_index
        self.reset()

    def reset(self) -> None:
        self.sums = dict.fromkeys(_SUMS, 0.0)
        self.pairs, self.ref_pairs, self.margin, self.wins = 0, 0, 0.0, 0

    def update(self, batch: MetricInputs) -> None:
        if batch.logprobs is None or batch.mask is None:
            return
        rows = batch.logprobs.shape[0]
        if rows % 2:
            raise InvalidArgumentError(
                f"DPOMetric needs (chosen, rejected) row pairs, got an odd batch of {rows}"
            )
        policy_B = (batch.logprobs * batch.mask).sum(-1)
        self.sums["chosen"] += float(policy_B[0::2].sum())
        self.sums["rejected"] += float(policy_B[1::2].sum())
        self.pairs += rows // 2
        if batch.ref_logprobs is None:
            return
        ref_B = (batch.ref_logprobs * batch.mask).sum(-1)
        chosen_P = self.beta * (policy_B[0::2] - ref_B[0::2])
        rejected_P = self.beta * (policy_B[1::2] - ref_B[1::2])
        self.sums["ref_chosen"] += float(ref_B[0::2].sum())
        self.sums["ref_rejected"] += float(ref_B[1::2].sum())
        self.sums["reward_chosen"] += float(chosen_P.sum())
        self.sums["reward_rejected"] += float(rejected_P.sum())
        self.margin += float((chosen_P - rejected_P).sum())
        self.wins += int(np.count_nonzero(chosen_P > rejected_P))
        self.ref_pairs += rows // 2

    def calculate(self) -> dict[str, float]:
        if not self.pairs:
            return {}
        out = {
            "logps/chosen": self.sums["chosen"] / self.pairs,
            "logps/rejected": self.sums["rejected"] / self.pairs,
        }
        if self.ref_pairs:
            n = self.ref_pairs
            out.update(
                {
                    "logps/ref_chosen": self.sums["ref_chosen"] / n,
                    "logps/ref_rejected": self.sums["ref_rejected"] / n,
                    "rewards/chosen": self.sums["reward_chosen"] / n,
                    "rewards/rejected": self.sums["reward_rejected"] / n,
                    "rewards/margins": self.margin / n,
                    "rewards/accuracies": self.wins / n,
                }
            )
        return out
