"""RLOO: each sample's reward against the mean of the other samples of its prompt."""

from __future__ import annotations

from typing import Any

import numpy as np

from twinkle.advantage.base import (
    Advantage,
    as_rewards,
    check_scale,
    group_rewards,
    like_input,
    resolve_group_size,
    scaled,
)
from twinkle.errors import InvalidArgumentError


class RLOOAdvantage(Advantage):
    """Leave-one-out baseline: ``r_i - mean(r_j for j != i)`` within the group (``G >= 2``).

    Args:
        group_size: Samples per prompt; a call's ``num_generations`` overrides it.
        scale: Default scaling, ``'none'`` (plain RLOO), ``'group'`` or ``'batch'`` (divide by
            that std, as :class:`GRPOAdvantage` does).
        eps: Added to the standard deviation when scaling.
    """

    def __init__(self, group_size: int | None = None, scale: str = "none", eps: float = 1e-6):
        if group_size is not None:
            _check_size(group_size)
        self.group_size, self.scale, self.eps = group_size, check_scale(scale), eps

    def __call__(
        self, rewards: Any, num_generations: int | None = None, scale: str | None = None
    ) -> Any:
        """Advantages (``[N]`` float32, a tensor when ``rewards`` was one) for flat rewards.

        Raises:
            InvalidArgumentError: a group size below 2 or one that does not divide ``N``.
        """
        size = _check_size(resolve_group_size(self.group_size, num_generations, "RLOOAdvantage"))
        rewards_K_G = group_rewards(as_rewards(rewards), size)
        others_K_G = (rewards_K_G.sum(axis=1, keepdims=True) - rewards_K_G) / (size - 1)
        advantages = scaled(
            rewards_K_G - others_K_G, rewards_K_G, check_scale(scale or self.scale), self.eps
        )
        return like_input(np.asarray(advantages).reshape(-1), rewards)


def _check_size(group_size: Any) -> Any:
    if isinstance(group_size, (int, np.integer)) and not isinstance(group_size, bool):
        if group_size < 2:
            raise InvalidArgumentError(f"RLOO needs group_size >= 2, got {group_size}")
    return group_size
