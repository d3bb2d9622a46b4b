"""Policy-gradient metrics: confidence, drift from the sampler's policy, clipping."""

from __future__ import annotations

import math

import numpy as np

from twinkle.metric.base import Metric, MetricInputs
from twinkle.metric.registry import register_metric


@register_metric("GRPOMetric")
class GRPOMetric(Metric):
    """Token-level statistics of an RL step (GRPO, PPO, ...), means over trained tokens.

    Keys: ``train/mean_new_logp`` and ``train/policy_confidence`` (its ``exp``); with the
    sampler's log-probs (``old_logps``): ``train/mean_old_logp``, ``train/logp_diff_mean``
    (new - old), ``train/approx_kl`` (mean of ``exp(d) - d - 1``, ``d = new - old``),
    ``train/token_kl_max``, ``train/token_ratio_max``; with advantages as well:
    ``train/clip_ratio_low`` (ratio below ``1 - epsilon`` where the advantage is negative),
    ``train/clip_ratio_high`` (above ``1 + epsilon_high`` where it is positive) and
    ``train/clip_ratio`` (their sum); with entropies: ``train/entropy``.

    Args:
        epsilon: Lower clip range (use the loss's).
        epsilon_high: Upper clip range; defaults to ``epsilon``.
        ignore_index: Accepted for upstream compatibility; the mask already leaves those out.
    """

    needs_entropies = True

    def __init__(
        self, epsilon: float = 0.2, epsilon_high: float | None = None, ignore_index: int = -100
    ) -> None:
        self.epsilon = float(epsilon)
        self.epsilon_high = float(epsilon if epsilon_high is None else epsilon_high)
        self.ignore_index = ignore_index
        self.reset()

    def reset(self) -> None:
        self.tokens, self.sum_new = 0.0, 0.0
        self.old_tokens, self.sum_old, self.sum_diff, self.sum_kl = 0.0, 0.0, 0.0, 0.0
        self.max_kl, self.max_ratio = 0.0, 0.0
        self.clip_tokens, self.clip_low, self.clip_high = 0.0, 0.0, 0.0
        self.entropy_tokens, self.sum_entropy = 0.0, 0.0

    def update(self, batch: MetricInputs) -> None:
        if batch.logprobs is None or batch.mask is None:
            return
        new_B_T, mask_B_T = batch.logprobs, batch.mask
        on = mask_B_T > 0
        self.tokens += float(mask_B_T.sum())
        self.sum_new += float((new_B_T * mask_B_T).sum())
        if batch.entropies is not None:
            self.sum_entropy += float((batch.entropies * mask_B_T).sum())
            self.entropy_tokens += float(mask_B_T.sum())
        if batch.old_logprobs is None or not on.any():
            return
        diff_B_T = np.where(on, new_B_T - batch.old_logprobs, 0.0)
        ratio_B_T = np.exp(diff_B_T)
        kl_B_T = ratio_B_T - diff_B_T - 1.0
        self.old_tokens += float(mask_B_T.sum())
        self.sum_old += float((batch.old_logprobs * mask_B_T).sum())
        self.sum_diff += float((diff_B_T * mask_B_T).sum())
        self.sum_kl += float((kl_B_T * mask_B_T).sum())
        self.max_kl = max(self.max_kl, float(kl_B_T[on].max()))
        self.max_ratio = max(self.max_ratio, float(ratio_B_T[on].max()))
        if batch.advantages is None:
            return
        adv = batch.advantages
        adv_B_T = np.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, ratio_B_T.shape)
        low = (ratio_B_T < 1.0 - self.epsilon) & (adv_B_T < 0) & on
        high = (ratio_B_T > 1.0 + self.epsilon_high) & (adv_B_T > 0) & on
        self.clip_low += float(low.sum())
        self.clip_high += float(high.sum())
        self.clip_tokens += float(mask_B_T.sum())

    def calculate(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        mean_new = self.sum_new / self.tokens
        out = {"train/mean_new_logp": mean_new, "train/policy_confidence": math.exp(mean_new)}
        if self.old_tokens:
            n = self.old_tokens
            out.update(
                {
                    "train/mean_old_logp": self.sum_old / n,
                    "train/logp_diff_mean": self.sum_diff / n,
                    "train/approx_kl": self.sum_kl / n,
                    "train/token_kl_max": self.max_kl,
                    "train/token_ratio_max": self.max_ratio,
                }
            )
        if self.clip_tokens:
            n = self.clip_tokens
            out["train/clip_ratio_low"] = self.clip_low / n
            out["train/clip_ratio_high"] = self.clip_high / n
            out["train/clip_ratio"] = (self.clip_low + self.clip_high) / n
        if self.entropy_tokens:
            out["train/entropy"] = self.sum_entropy / self.entropy_tokens
        return out
