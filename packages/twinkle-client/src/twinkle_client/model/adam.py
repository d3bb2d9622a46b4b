"""The hyper-parameters of one Tinker-style optimizer step (``optim_step``).

A wire type: the library's backends take the very same class (``twinkle.model.AdamParams``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class AdamParams:
    """One Tinker-style optimizer step's hyper-parameters (AdamW with decoupled weight decay).

    Attributes:
        learning_rate: Step size; 0 computes (and reports) the gradient norm without moving
            the weights.
        beta1, beta2: Adam's moment decay rates, each in ``[0, 1)``.
        eps: Adam's denominator guard.
        weight_decay: Decoupled weight decay (AdamW).
        grad_clip_norm: Clip the tenant's gradients to this global L2 norm first; 0: no clipping.

    Raises:
        ValueError: A value Adam cannot use (negative, not finite, betas outside ``[0, 1)``).
    """

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"adam_params.{f.name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"adam_params.{f.name} must be finite, got {value!r}")
            object.__setattr__(self, f.name, float(value))
        if self.learning_rate < 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(
                f"beta1 and beta2 must be in [0, 1), got {self.beta1} and {self.beta2}"
            )
        for name in ("eps", "weight_decay", "grad_clip_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def coerce(cls, params: AdamParams | Mapping[str, Any] | None) -> AdamParams:
        """``params`` as :class:`AdamParams`: a mapping's missing or ``None`` fields take the
        defaults; unknown fields are refused."""
        if params is None:
            return cls()
        if isinstance(params, cls):
            return params
        if not isinstance(params, Mapping):
            raise ValueError(f"adam_params must be an object, got {type(params).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(
                f"unknown adam_params field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**{k: v for k, v in params.items() if v is not None})

    def optimizer_kwargs(self) -> dict[str, Any]:
        """The AdamW constructor's keyword arguments for these parameters."""
        return {
            "lr": self.learning_rate,
            "betas": (self.beta1, self.beta2),
            "eps": self.eps,
            "weight_decay": self.weight_decay,
        }


__all__ = ["AdamParams"]
