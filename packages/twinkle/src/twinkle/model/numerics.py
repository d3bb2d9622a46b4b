"""Finite training, for every backend: the valid ranges of optimizer hyper-parameters, and the
guard every optimizer step goes through.

Two rules keep a tenant's adapter finite:

1. Hyper-parameters outside :data:`RANGES` are refused before anything is built or stepped
   (``set_optimizer``, native and Tinker ``optim_step``, the mock's optimizers alike), with the
   valid range in the message.
2. :func:`guarded_step` takes a snapshot of what a step changes (weights, optimizer state,
   gradients), clips, refuses non-finite gradient norms before applying anything, applies the
   step, checks the updated weights (one ``isfinite`` reduction per tenant) and, when any is
   non-finite, puts every stepped tenant back exactly as it was and raises
   :class:`~twinkle.errors.NonFiniteUpdateError`. The backend supplies the snapshot and the check
   (torch: :mod:`twinkle.model.step.optimizer`; numpy: :mod:`twinkle.model.mock`).

A check after the step with a rollback, rather than a prediction before it: whether an update
overflows depends on the optimizer's arithmetic (fused Adam, SGD momentum, a custom class, the
tensor-parallel Adam), which only running it shows; the snapshot is a copy of LoRA-sized buffers.

This module imports neither torch nor numpy (the server's protocol layer uses the ranges).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twinkle.errors import InvalidArgumentError, NonFiniteUpdateError

MAX_LEARNING_RATE = 10.0


@dataclass(frozen=True)
class Range:
    """A closed or half-open interval of valid values."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        high = "inf)" if math.isinf(self.high) else f"{self.high:g}{')' if self.high_open else ']'}"
        return f"{'(' if self.low_open else '['}{self.low:g}, {high}"


_UNIT = Range(0.0, 1.0, high_open=True)

#: The valid value of each hyper-parameter, by the name the caller uses.
RANGES: dict[str, Range] = {
    "lr": Range(0.0, MAX_LEARNING_RATE, low_open=True),
    "max_lr": Range(0.0, MAX_LEARNING_RATE, low_open=True),
    # Tinker's AdamParams: 0 reports the gradient norm without moving the weights.
    "learning_rate": Range(0.0, MAX_LEARNING_RATE),
    "beta1": _UNIT,
    "beta2": _UNIT,
    # 0 divides a never-updated entry's zero moment by zero: NaN on the first step.
    "eps": Range(0.0, 1.0, low_open=True),
    "weight_decay": Range(0.0, 1.0),
    "momentum": _UNIT,
    "dampening": Range(0.0, 1.0),
    "min_lr_ratio": Range(0.0, 1.0),
    "max_grad_norm": Range(0.0, math.inf, low_open=True, high_open=True),
    # Tinker's AdamParams: 0 means no clipping.
    "grad_clip_norm": Range(0.0, math.inf, high_open=True),
}


_LABELS = {"lr": "lr (the learning rate)", "max_lr": "max_lr (the peak learning rate)"}


def check_value(name: str, value: Any, where: str = "") -> float:
    """``value`` as a float when it is a finite number in ``RANGES[name]``.

    Raises:
        InvalidArgumentError: Naming ``where + name`` and the valid range.
    """
    valid = RANGES[name]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or float(value) not in valid:
        label = _LABELS.get(name, name)
        raise InvalidArgumentError(
            f"{where}{label} must be a finite number in {valid}, got {value!r}"
        )
    return float(value)


def check_optimizer_kwargs(kwargs: Mapping[str, Any], where: str = "") -> None:
    """The hyper-parameters of ``set_optimizer(name, **kwargs)`` that have a range, checked
    (``betas`` as ``beta1`` and ``beta2``); other arguments are the optimizer's own business.

    Raises:
        InvalidArgumentError: A value outside its range.
    """
    for name in ("lr", "eps", "weight_decay", "momentum", "dampening", "beta1", "beta2"):
        if name in kwargs:
            check_value(name, kwargs[name], where)
    if "betas" in kwargs:
        betas = kwargs["betas"]
        if not isinstance(betas, Sequence) or isinstance(betas, str) or len(betas) != 2:
            raise InvalidArgumentError(f"{where}betas must be two numbers, got {betas!r}")
        check_value("beta1", betas[0], f"{where}betas: ")
        check_value("beta2", betas[1], f"{where}betas: ")


def check_adam_params(params: Any, where: str = "adam_params.") -> None:
    """Every field of an ``AdamParams`` (the dataclass, or any object with its attributes).

    Raises:
        InvalidArgumentError: A value outside its range.
    """
    for name in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
        check_value(name, getattr(params, name), where)


# ------------------------------------------------------------------------------- the step guard
Snapshot = Callable[[], None]
"""What :func:`guarded_step`'s ``take`` returns: a callable that puts the tenant back."""


def guarded_step(
    names: list[str],
    *,
    take: Callable[[int], Snapshot],
    clip: Callable[[], list[float]],
    apply: Callable[[], None],
    finite: Callable[[], list[bool]],
    agree: Callable[[bool], bool] | None = None,
    hyper: str = "",
) -> list[float]:
    """One optimizer step for the tenants ``names``, applied only if every weight stays finite.

    Args:
        names: The tenants (as their messages name them), in the order of the callables' lists.
        take: ``take(i)`` snapshots tenant ``i`` (weights, optimizer state, gradients) and
            returns the callable that restores it.
        clip: Computes (and applies) the clipping; returns each tenant's gradient norm.
        apply: The optimizer step(s).
        finite: Whether each tenant's weights are all finite after ``apply``.
        agree: Ranks holding different parts of the same tenants (pipeline stages) combine
            their verdicts: ``agree(ok)`` is True only if every rank's ``ok`` is.
        hyper: The hyper-parameters, for the message (``"lr 10, weight_decay 1"``).

    Returns:
        The gradient norms ``clip`` returned.

    Raises:
        NonFiniteUpdateError: A gradient norm or an updated weight is not finite; every tenant
            of the call is as it was before (weights, optimizer state and gradients).
    """
    restores = [take(i) for i in range(len(names))]
    norms = clip()
    bad_grads = [n for n, norm in zip(names, norms) if not math.isfinite(norm)]
    bad_weights: list[str] = []
    if not bad_grads:
        apply()
        bad_weights = [n for n, ok in zip(names, finite()) if not ok]
    ok = not bad_grads and not bad_weights
    if agree is not None and not agree(ok) and ok:
        bad_weights = list(names)  # another stage's part of these adapters overflowed
    if bad_grads or bad_weights:
        for restore in restores:
            restore()
        raise NonFiniteUpdateError(_refusal(names, norms, bad_grads, bad_weights, hyper))
    return norms


def _refusal(
    names: list[str], norms: list[float], bad_grads: list[str], bad_weights: list[str], hyper: str
) -> str:
    kept = (
        "its weights, optimizer state and gradients are unchanged (discard the gradients with "
        "zero_grad, or with optim_step at learning_rate 0, or load a checkpoint)"
    )
    if bad_grads:
        norm_of = dict(zip(names, norms))
        which = ", ".join(f"{n!r} (gradient norm {norm_of[n]})" for n in bad_grads)
        return (
            f"optimizer step refused for adapter {which}: its gradients are not finite, so the "
            f"step would make its weights non-finite (check the inputs and loss of the last "
            f"forward_backward); {kept}"
        )
    which = ", ".join(repr(n) for n in bad_weights)
    settings = f" with {hyper}" if hyper else ""
    return (
        f"optimizer step refused for adapter {which}: the update{settings} would make its "
        f"weights non-finite (lower the learning rate or weight decay, or clip the gradients); "
        f"{kept}"
    )


__all__ = [
    "MAX_LEARNING_RATE",
    "RANGES",
    "Range",
    "check_adam_params",
    "check_optimizer_kwargs",
    "check_value",
    "guarded_step",
]
