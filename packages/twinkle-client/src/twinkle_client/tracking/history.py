"""A run's training history: one point per optimizer step, bounded, thinned where it is oldest.

The server records it for every run (``TwinkleClient.get_training_history``) and the local model
for every adapter (``model.get_training_history``); both build their points with
:class:`StepAccumulator` and bound them the same way:

- points live in blocks of :data:`BLOCK_POINTS`; a run keeps at most :data:`MAX_POINTS` points;
- past that, its two oldest blocks are merged into one that keeps every other point, so the
  newest steps keep every point and older stretches are kept at a coarser stride the older
  they are (``thinned`` says when this happened; ``recorded`` counts every point ever made).
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_POINTS = 10_000
BLOCK_POINTS = 200
MAX_BLOCKS = MAX_POINTS // BLOCK_POINTS

#: The figures of a point besides ``step`` and ``time``, in the order trackers show them.
SCALARS = ("loss", "num_tokens", "learning_rate", "grad_norm", "step_time_s")


class HistoryPoint(BaseModel):
    """One optimizer step of a run.

    Attributes:
        step: Optimizer steps taken, this one included.
        time: When the step finished (seconds since the epoch).
        loss: Mean loss of the ``forward_backward`` calls since the previous step.
        num_tokens: Tokens those calls trained on.
        learning_rate: The learning rate this step used (``None``: not reported).
        grad_norm: Gradient norm before clipping (``None``: not reported).
        step_time_s: Wall seconds since the previous step finished (``None`` for the first
            step seen).
        micro_batches: ``forward_backward`` calls in this step.
        metrics: What the loss reported (``kl``, ``clip_frac``, ...), averaged over those calls.
    """

    model_config = ConfigDict(extra="ignore")

    step: int
    time: float
    loss: float | None = None
    num_tokens: int = 0
    learning_rate: float | None = None
    grad_norm: float | None = None
    step_time_s: float | None = None
    micro_batches: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)

    def scalars(self) -> dict[str, float]:
        """The point as flat, finite numbers for a tracker: the figures it has, and each loss
        metric as ``metrics/<name>``."""
        flat: dict[str, Any] = {name: getattr(self, name) for name in SCALARS}
        flat.update({f"metrics/{k}": v for k, v in self.metrics.items()})
        return {k: float(v) for k, v in flat.items() if _finite(v)}


class TrainingHistory(BaseModel):
    """What ``get_training_history`` returns, locally and from a server.

    Attributes:
        run_id: The training run (locally: the adapter name).
        points: Oldest first.
        recorded: Points recorded over the run's life (more than ``len(points)`` once thinned).
        thinned: Whether older points were thinned to stay under ``max_points``.
        max_points: The bound.
    """

    model_config = ConfigDict(extra="ignore")

    run_id: str
    points: list[HistoryPoint] = Field(default_factory=list)
    recorded: int = 0
    thinned: bool = False
    max_points: int = MAX_POINTS

    def series(self, name: str) -> list[tuple[int, float]]:
        """``(step, value)`` of one scalar (``loss``, ``grad_norm``, ``metrics/kl``, ...)."""
        return [(p.step, s[name]) for p in self.points if name in (s := p.scalars())]


def merge_oldest(first: list[Any], second: list[Any]) -> list[Any]:
    """The thinning rule: two consecutive blocks become one keeping every other point."""
    return (list(first) + list(second))[::2]


class StepAccumulator:
    """The ``forward_backward`` figures since the last optimizer step, closed into a point by
    :meth:`close` when the step is taken."""

    def __init__(self) -> None:
        self._reset()
        self.last_step_time: float | None = None
        self.last_step = 0

    def _reset(self) -> None:
        self.calls, self.loss_sum, self.loss_calls, self.tokens = 0, 0.0, 0, 0
        self.metric_sums: dict[str, float] = {}
        self.metric_calls: dict[str, int] = {}

    def add(
        self, loss: Any = None, num_tokens: Any = 0, metrics: dict[str, Any] | None = None
    ) -> None:
        """One ``forward_backward``: its loss, trained tokens and the loss's metrics (values
        that are not finite numbers are skipped)."""
        self.calls += 1
        if _finite(loss):
            self.loss_sum, self.loss_calls = self.loss_sum + float(loss), self.loss_calls + 1
        if _finite(num_tokens):
            self.tokens += int(num_tokens)
        for key, value in (metrics or {}).items():
            if _finite(value) and key != "loss":
                self.metric_sums[key] = self.metric_sums.get(key, 0.0) + float(value)
                self.metric_calls[key] = self.metric_calls.get(key, 0) + 1

    def close(
        self,
        step: int,
        learning_rate: Any = None,
        grad_norm: Any = None,
        now: float | None = None,
    ) -> HistoryPoint:
        """The point of the step just taken; starts the next one."""
        now = time.time() if now is None else now
        point = HistoryPoint(
            step=int(step),
            time=now,
            loss=self.loss_sum / self.loss_calls if self.loss_calls else None,
            num_tokens=self.tokens,
            learning_rate=float(learning_rate) if _finite(learning_rate) else None,
            grad_norm=float(grad_norm) if _finite(grad_norm) else None,
            step_time_s=None if self.last_step_time is None else now - self.last_step_time,
            micro_batches=self.calls,
            metrics={k: s / self.metric_calls[k] for k, s in self.metric_sums.items()},
        )
        self.last_step_time, self.last_step = now, point.step
        self._reset()
        return point


class PointLog:
    """Points kept in memory under the bound and thinning rule of this module."""

    def __init__(self, max_points: int = MAX_POINTS, block_points: int = BLOCK_POINTS) -> None:
        if block_points < 1 or max_points < 2 * block_points:
            raise ValueError("max_points must hold at least two blocks of block_points")
        self.max_blocks, self.block_points = max_points // block_points, block_points
        self.max_points = self.max_blocks * block_points
        self.blocks: list[list[HistoryPoint]] = [[]]
        self.recorded, self.thinned = 0, False

    def append(self, point: HistoryPoint) -> None:
        if len(self.blocks[-1]) >= self.block_points:
            self.blocks.append([])
        self.blocks[-1].append(point)
        self.recorded += 1
        if len(self.blocks) > self.max_blocks:
            self.blocks[:2] = [merge_oldest(self.blocks[0], self.blocks[1])]
            self.thinned = True

    @property
    def last_step(self) -> int:
        return self.blocks[-1][-1].step if self.blocks[-1] else 0

    def history(self, run_id: str, since_step: int | None = None) -> TrainingHistory:
        points: list[HistoryPoint] = []
        for block in reversed(self.blocks):  # newest first: a poll reads the tail only
            points[:0] = [p for p in block if since_step is None or p.step > since_step]
            if block and since_step is not None and block[0].step <= since_step:
                break
        return TrainingHistory(
            run_id=run_id,
            points=[p.model_copy() for p in points],
            recorded=self.recorded,
            thinned=self.thinned,
            max_points=self.max_points,
        )


class TrainingHistoryRecorder:
    """One adapter's history in memory (the local model keeps one per tenant).

    Args:
        max_points: The bound (default :data:`MAX_POINTS`).
    """

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.pending = StepAccumulator()
        self.log = PointLog(max_points)

    def forward_backward(
        self, loss: Any, num_tokens: Any, metrics: dict[str, Any] | None = None
    ) -> None:
        self.pending.add(loss, num_tokens, metrics)

    def stepped(self, step: int, learning_rate: Any = None, grad_norm: Any = None) -> HistoryPoint:
        point = self.pending.close(step, learning_rate, grad_norm)
        self.log.append(point)
        return point

    def history(self, run_id: str, since_step: int | None = None) -> TrainingHistory:
        return self.log.history(run_id, since_step)


def _finite(value: Any) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


__all__ = [
    "BLOCK_POINTS",
    "MAX_POINTS",
    "HistoryPoint",
    "PointLog",
    "StepAccumulator",
    "TrainingHistory",
    "TrainingHistoryRecorder",
    "merge_oldest",
]
