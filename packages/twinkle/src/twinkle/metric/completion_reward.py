"""Client-side RL metrics: rewards by kind, completion lengths, rollout timings."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.metric.base import Metric


class CompletionRewardMetric(Metric):
    """Accumulated in the training script, step by step, then reported and reset.

    ``accumulate(rewards={'total': [...], 'format': [...]}, completion_lengths=[...])`` (the two
    leading positional arguments of upstream's call, ``None, None``, are accepted and ignored).
    Keys: ``train/<kind>_reward`` (mean), ``train/<kind>_reward_std`` (sample std, 0 for fewer
    than two values), ``train/completion_length`` (mean), and, where timings were given,
    ``profiling/Time taken: generate`` and ``profiling/Time taken: move_model_to_sampler``
    (means, seconds).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.rewards: dict[str, list[float]] = {}
        self.completion_lengths: list[float] = []
        self.generate_time: list[float] = []
        self.weight_sync_time: list[float] = []

    def accumulate(
        self,
        inputs: Any = None,
        outputs: Any = None,
        *,
        rewards: Mapping[str, Sequence[float]] | None = None,
        completion_lengths: Sequence[int] | None = None,
        generate_time: float | None = None,
        weight_sync_time: float | None = None,
    ) -> None:
        """Add one step's rewards (by kind), completion lengths and timings."""
        for kind, values in (rewards or {}).items():
            self.rewards.setdefault(str(kind), []).extend(float(v) for v in values)
        self.completion_lengths.extend(float(n) for n in completion_lengths or [])
        if generate_time is not None:
            self.generate_time.append(float(generate_time))
        if weight_sync_time is not None:
            self.weight_sync_time.append(float(weight_sync_time))

    def calculate(self) -> dict[str, float]:
        out = {}
        for kind, values in self.rewards.items():
            if values:
                out[f"train/{kind}_reward"] = statistics.fmean(values)
                out[f"train/{kind}_reward_std"] = (
                    statistics.stdev(values) if len(values) > 1 else 0.0
                )
        if self.completion_lengths:
            out["train/completion_length"] = statistics.fmean(self.completion_lengths)
        if self.generate_time:
            out["profiling/Time taken: generate"] = statistics.fmean(self.generate_time)
        if self.weight_sync_time:
            out["profiling/Time taken: move_model_to_sampler"] = statistics.fmean(
                self.weight_sync_time
            )
        return out
