"""``Metric``: what ``calculate_metric`` returns (the same shape as ``twinkle.model.Metric``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Metric:
    """A metric snapshot; ``result`` is a plain dict (loss, token_acc, grad_norm, lr, step, ...)."""

    result: dict[str, Any]

    def __repr__(self) -> str:
        return f"Metric({self.result})"
