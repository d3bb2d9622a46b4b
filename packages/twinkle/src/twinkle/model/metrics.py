"""Per-tenant training metrics: what ``calculate_metric`` reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Metric:
    """A metric snapshot; ``result`` is a plain dict (loss, token_acc, grad_norm, lr, step, ...)."""

    result: dict[str, Any]

    def __repr__(self) -> str:
        return f"Metric({self.result})"


@dataclass
class MetricAccumulator:
    """Sums over micro-batches since the last report, kept apart for training and evaluation."""

    loss_sum: float = 0.0
    batches: int = 0
    correct: int = 0
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def add(
        self, loss: float, correct: int, tokens: int, extra: dict[str, float] | None = None
    ) -> None:
        self.loss_sum += loss
        self.batches += 1
        self.correct += correct
        self.tokens += tokens
        for key, value in (extra or {}).items():
            self.extra[key] = value

    def report(self) -> dict[str, Any]:
        """Averages since the last report, then start over."""
        result: dict[str, Any] = {
            "loss": self.loss_sum / self.batches if self.batches else None,
            "token_acc": self.correct / self.tokens if self.tokens else None,
            "num_tokens": self.tokens,
        }
        result.update(self.extra)
        self.loss_sum, self.batches, self.correct, self.tokens, self.extra = 0.0, 0, 0, 0, {}
        return result
