"""``Metric``: what ``calculate_metric`` returns (the same shape as ``twinkle.model.Metric``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class Metric(Mapping):
    """A metric snapshot; ``result`` is a plain dict (loss, token_acc, grad_norm, lr, step, ...).

    It reads like that dict too (``snapshot['loss']``, ``dict(snapshot)``,
    ``log.update(snapshot)``).
    """

    result: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.result[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.result)

    def __len__(self) -> int:
        return len(self.result)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Metric):
            return self.result == other.result
        return isinstance(other, Mapping) and self.result == dict(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Metric({self.result})"
