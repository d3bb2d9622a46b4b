"""GRPO: each sample's reward against its group's mean, scaled by the group's spread."""

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


class GRPOAdvantage(Advantage):
    """Group-normalised advantage: ``(r - mean_group) / (std_group + eps)``.

    ``std_group`` is the population standard deviation (``ddof=0``); a group whose rewards are all
    equal gets advantage 0 (it carries no preference). Two call styles:

    >>> GRPOAdvantage(group_size=4)(rewards)                                  # doctest: +SKIP
    >>> GRPOAdvantage()(rewards, num_generations=4, scale="group").tolist()   # doctest: +SKIP

    Args:
        group_size: Samples per prompt; a call's ``num_generations`` overrides it.
        eps: Added to the standard deviation.
        scale_by_std: ``False`` gives Dr. GRPO's ``r - mean_group`` (the default ``scale`` becomes
            ``'none'``).
    """

    def __init__(
        self, group_size: int | None = None, eps: float = 1e-6, scale_by_std: bool = True
    ) -> None:
        self.group_size, self.eps, self.scale_by_std = group_size, eps, scale_by_std

    def __call__(
        self, rewards: Any, num_generations: int | None = None, scale: str | None = None
    ) -> Any:
        """Advantages for flat rewards, group by group.

        Args:
            rewards: ``[N]`` rewards (list, numpy array or tensor), ``G`` samples per prompt in a
                row, in the order ``SampleResponse.sequences`` gives them.
            num_generations: ``G``; defaults to the constructor's ``group_size``.
            scale: ``'group'`` (divide by the group's std), ``'batch'`` (by the std of all
                rewards) or ``'none'``; defaults to ``'group'`` (``'none'`` with
                ``scale_by_std=False``).

        Returns:
            ``[N]`` float32 numpy array (a tensor when ``rewards`` was one).

        Raises:
            InvalidArgumentError: no group size, one that does not divide ``N``, or an unknown
                ``scale``.
        """
        size = resolve_group_size(self.group_size, num_generations, type(self).__name__)
        scale = check_scale(scale or ("group" if self.scale_by_std else "none"))
        rewards_K_G = group_rewards(as_rewards(rewards), size)
        centred_K_G = rewards_K_G - rewards_K_G.mean(axis=1, keepdims=True)
        advantages = scaled(centred_K_G, rewards_K_G, scale, self.eps)
        return like_input(np.asarray(advantages).reshape(-1), rewards)
