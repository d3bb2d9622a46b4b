"""Supervised-training metrics: loss, token accuracy, learning rate and throughput."""

from __future__ import annotations

import time
from collections.abc import Callable

from twinkle.metric.base import Metric, MetricInputs
from twinkle.metric.registry import register_metric


@register_metric("LossMetric")
class LossMetric(Metric):
    """Mean loss over the forwards since the last reset. Key: ``loss``."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total, self.count = 0.0, 0

    def update(self, batch: MetricInputs) -> None:
        if batch.loss is not None:
            self.total += batch.loss
            self.count += 1

    def calculate(self) -> dict[str, float]:
        return {"loss": self.total / self.count} if self.count else {}


@register_metric("Accuracy")
class Accuracy(Metric):
    """Share of trained tokens whose argmax is the target.

    Keys: ``accuracy``, ``correct_tokens``, ``total_tokens``.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.correct, self.total = 0, 0

    def update(self, batch: MetricInputs) -> None:
        if batch.correct is not None:
            self.correct += batch.correct
            self.total += batch.num_tokens

    def calculate(self) -> dict[str, float]:
        if not self.total:
            return {}
        return {
            "accuracy": self.correct / self.total,
            "correct_tokens": float(self.correct),
            "total_tokens": float(self.total),
        }


@register_metric("TrainMetric")
class TrainMetric(Metric):
    """Learning rate, optimizer step and throughput.

    Keys: ``learning_rate`` and ``iters`` (as of the last forward), ``elapsed_seconds`` (since
    the metric was attached), ``samples_per_second`` and ``tokens_per_second`` (since the last
    reset).

    Args:
        clock: Seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.lr: float | None = None
        self.step: int | None = None
        self.reset()

    def reset(self) -> None:
        self.window_start = self.clock()
        self.samples, self.tokens = 0, 0

    def update(self, batch: MetricInputs) -> None:
        self.lr = batch.lr if batch.lr is not None else self.lr
        self.step = batch.step if batch.step is not None else self.step
        if batch.mask is not None:
            self.samples += int(batch.mask.shape[0])
        self.tokens += batch.num_tokens

    def calculate(self) -> dict[str, float]:
        now = self.clock()
        out = {"elapsed_seconds": now - self.started}
        if self.lr is not None:
            out["learning_rate"] = self.lr
        if self.step is not None:
            out["iters"] = float(self.step)
        window = now - self.window_start
        if window > 0:
            out["samples_per_second"] = self.samples / window
            out["tokens_per_second"] = self.tokens / window
        return out
