"""The advantage contract and the grouping of flat rewards shared by the group estimators."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from twinkle.errors import InvalidArgumentError

SCALES = ("group", "batch", "none")


class Advantage:
    """Base class of advantage estimators: ``advantage_fn(rewards, ...) -> advantages``."""

    def __call__(self, rewards: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def as_rewards(rewards: Sequence[float] | Any) -> np.ndarray:
    """Flat float64 rewards ``[N]`` from a list, a numpy array or a tensor (without importing
    torch)."""
    if hasattr(rewards, "detach"):
        rewards = rewards.detach().cpu().numpy()
    rewards_N = np.asarray(rewards, dtype=np.float64)
    if rewards_N.ndim != 1:
        raise InvalidArgumentError(
            f"rewards must be flat, one per sample; got shape {tuple(rewards_N.shape)}"
        )
    return rewards_N


def group_rewards(rewards_N: np.ndarray, group_size: Any) -> np.ndarray:
    """``[K, G]``: rows ``[k*G, (k+1)*G)`` are the samples of prompt ``k``."""
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise InvalidArgumentError(f"group_size must be an integer >= 1, got {group_size!r}")
    if group_size < 1:
        raise InvalidArgumentError(f"group_size must be an integer >= 1, got {group_size!r}")
    if rewards_N.shape[0] % group_size:
        raise InvalidArgumentError(
            f"{rewards_N.shape[0]} rewards do not split into groups of {group_size}"
        )
    return rewards_N.reshape(-1, int(group_size))


def resolve_group_size(own: int | None, num_generations: int | None, name: str) -> int:
    """The group size of one call: ``num_generations`` if given, else the constructor's."""
    size = num_generations if num_generations is not None else own
    if size is None:
        raise InvalidArgumentError(
            f"{name} needs the samples per prompt: pass num_generations= to the call "
            f"or group_size= to the constructor"
        )
    return size


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise InvalidArgumentError(f"scale must be one of {SCALES}, got {scale!r}")
    return scale


def scaled(centred_K_G: np.ndarray, rewards_K_G: np.ndarray, scale: str, eps: float) -> np.ndarray:
    """Divide centred advantages by the group's or the batch's std (population, ``ddof=0``);
    where that std is 0 the advantage is 0: equal rewards carry no preference."""
    if scale == "none":
        return centred_K_G
    if scale == "group":
        std = rewards_K_G.std(axis=1, keepdims=True)
    else:
        std = np.full((rewards_K_G.shape[0], 1), rewards_K_G.std())
    std_K_G = np.broadcast_to(std, centred_K_G.shape)
    return np.divide(centred_K_G, std_K_G + eps, out=np.zeros_like(centred_K_G), where=std_K_G > 0)


def like_input(advantages_N: np.ndarray, rewards: Any) -> Any:
    """float32 numpy, or a tensor when the rewards came as one (same device)."""
    out = advantages_N.astype(np.float32)
    if hasattr(rewards, "detach"):
        import torch

        return torch.from_numpy(out).to(rewards.device)
    return out
