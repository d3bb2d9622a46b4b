"""Generalised advantage estimation over the tokens of each completion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from twinkle.advantage.base import Advantage
from twinkle.errors import InvalidArgumentError


class GAEAdvantage(Advantage):
    """Token-level GAE: ``A_t = delta_t + gamma * lambda * A_{t+1}`` with
    ``delta_t = r_t + gamma * V_{t+1} - V_t`` over each row's valid positions (``V`` after the
    last valid token is 0: a completion ends its episode).

    Args:
        gamma: Discount in ``[0, 1]``.
        gae_lambda: GAE's lambda in ``[0, 1]``.
        normalize: Whiten the advantages over all valid tokens (mean 0, population std 1).
    """

    def __init__(self, gamma: float = 1.0, gae_lambda: float = 0.95, normalize: bool = True):
        for name, value in (("gamma", gamma), ("gae_lambda", gae_lambda)):
            if not 0.0 <= value <= 1.0:
                raise InvalidArgumentError(f"{name} must be in [0, 1], got {value!r}")
        self.gamma, self.gae_lambda, self.normalize = gamma, gae_lambda, normalize

    @staticmethod
    def build_token_rewards(
        rewards: Sequence[float],
        lengths: Sequence[int],
        *,
        old_logps: Sequence[Sequence[float]] | None = None,
        ref_logps: Sequence[Sequence[float]] | None = None,
        kl_coef: float = 0.0,
    ) -> list[list[float]]:
        """Per-token rewards: each sequence's reward on its last token, plus, with both log-prob
        lists, a per-token KL penalty ``-kl_coef * (old - ref)``."""
        rewards = [float(r) for r in np.asarray(rewards, dtype=np.float64).reshape(-1)]
        if len(rewards) != len(lengths):
            raise InvalidArgumentError(f"{len(rewards)} rewards for {len(lengths)} lengths")
        if (old_logps is None) != (ref_logps is None):
            raise InvalidArgumentError("old_logps and ref_logps go together")
        out = []
        for i, (reward, length) in enumerate(zip(rewards, lengths)):
            if length <= 0:
                raise InvalidArgumentError(f"sequence {i} has length {length}; lengths must be > 0")
            values = [0.0] * length
            if old_logps is not None and ref_logps is not None:
                if len(old_logps[i]) != length or len(ref_logps[i]) != length:
                    raise InvalidArgumentError(
                        f"sequence {i}: log-probs do not have {length} tokens"
                    )
                values = [
                    -kl_coef * (float(o) - float(r)) for o, r in zip(old_logps[i], ref_logps[i])
                ]
            values[-1] += reward
            out.append(values)
        return out

    def __call__(
        self,
        rewards: Any,
        values: Any,
        *,
        masks: Any = None,
        normalize: bool | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Advantages and returns (``[B, T]`` float32 each, 0 at masked positions).

        Args:
            rewards: ``[B, T]`` (or ``[T]``) per-token rewards.
            values: Value estimates of the same shape.
            masks: Valid positions (default: all).
            normalize: Overrides the constructor's ``normalize``.
        """
        rewards_B_T = np.atleast_2d(np.asarray(rewards, dtype=np.float64))
        values_B_T = np.atleast_2d(np.asarray(values, dtype=np.float64))
        if rewards_B_T.shape != values_B_T.shape:
            raise InvalidArgumentError(
                f"rewards {rewards_B_T.shape} and values {values_B_T.shape} differ in shape"
            )
        mask_B_T = (
            np.ones(rewards_B_T.shape, bool)
            if masks is None
            else np.atleast_2d(np.asarray(masks, bool))
        )
        if mask_B_T.shape != rewards_B_T.shape:
            raise InvalidArgumentError(
                f"masks {mask_B_T.shape} do not match rewards {rewards_B_T.shape}"
            )
        advantages_B_T = np.zeros_like(rewards_B_T)
        for b in range(rewards_B_T.shape[0]):
            positions = np.flatnonzero(mask_B_T[b])
            running, next_value = 0.0, 0.0
            for pos in positions[::-1]:
                delta = rewards_B_T[b, pos] + self.gamma * next_value - values_B_T[b, pos]
                running = delta + self.gamma * self.gae_lambda * running
                advantages_B_T[b, pos], next_value = running, values_B_T[b, pos]
        returns_B_T = np.where(mask_B_T, advantages_B_T + values_B_T, 0.0)
        if (self.normalize if normalize is None else normalize) and mask_B_T.sum() > 1:
            valid = advantages_B_T[mask_B_T]
            whitened = (advantages_B_T - valid.mean()) / (valid.std() + 1e-8)
            advantages_B_T = np.where(mask_B_T, whitened, 0.0)
        return advantages_B_T.astype(np.float32), returns_B_T.astype(np.float32)
