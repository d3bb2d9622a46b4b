"""Advantages from rewards of groups of samples of the same prompt.

Rewards are flat, group by group: with ``group_size=G`` rows ``[k*G, (k+1)*G)`` are the samples of
prompt ``k`` (the order ``SampleResponse.sequences`` gives with ``num_samples=G``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _groups(rewards: Sequence[float] | np.ndarray, group_size: int) -> np.ndarray:
    rewards_N = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    if rewards_N.shape[0] % group_size:
        raise ValueError(f"{rewards_N.shape[0]} rewards do not split into groups of {group_size}")
    return rewards_N.reshape(-1, group_size)


class GRPOAdvantage:
    """Group-normalised advantage: ``(r - mean_group) / (std_group + eps)``.

    ``std_group`` is the population standard deviation (``ddof=0``); a group whose rewards are all
    equal gets advantage 0 (it carries no preference).

    Args:
        group_size: Samples per prompt.
        eps: Added to the standard deviation.
        scale_by_std: ``False`` gives Dr. GRPO's ``r - mean_group`` (no division).
    """

    def __init__(self, group_size: int, eps: float = 1e-6, scale_by_std: bool = True) -> None:
        self.group_size, self.eps, self.scale_by_std = group_size, eps, scale_by_std

    def __call__(self, rewards: Sequence[float] | np.ndarray) -> np.ndarray:
        """Advantages ([N], float32) for flat rewards ([N])."""
        rewards_K_G = _groups(rewards, self.group_size)
        centred_K_G = rewards_K_G - rewards_K_G.mean(axis=1, keepdims=True)
        if self.scale_by_std:
            std_K_1 = rewards_K_G.std(axis=1, keepdims=True)
            scaled_K_G = np.divide(
                centred_K_G, std_K_1 + self.eps, out=np.zeros_like(centred_K_G), where=std_K_1 > 0
            )
            centred_K_G = scaled_K_G
        return centred_K_G.reshape(-1).astype(np.float32)


class RLOOAdvantage:
    """Leave-one-out baseline: ``r_i - mean(r_j for j != i)`` within the group (``group_size >= 2``)."""

    def __init__(self, group_size: int) -> None:
        if group_size < 2:
            raise ValueError(f"RLOO needs group_size >= 2, got {group_size}")
        self.group_size = group_size

    def __call__(self, rewards: Sequence[float] | np.ndarray) -> np.ndarray:
        """Advantages ([N], float32) for flat rewards ([N])."""
        rewards_K_G = _groups(rewards, self.group_size)
        others_K_G = (rewards_K_G.sum(axis=1, keepdims=True) - rewards_K_G) / (self.group_size - 1)
        return (rewards_K_G - others_K_G).reshape(-1).astype(np.float32)
