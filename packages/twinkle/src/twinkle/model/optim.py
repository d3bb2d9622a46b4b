"""Optimizers and learning-rate schedulers by name, built over one tenant's parameters."""

from __future__ import annotations

import math
from typing import Any

import torch

from twinkle.errors import ArgumentTypeError, InvalidArgumentError
from twinkle.model.numerics import check_optimizer_kwargs, check_value

OPTIMIZERS = {
    "Adam": torch.optim.Adam,
    "AdamW": torch.optim.AdamW,
    "SGD": torch.optim.SGD,
    # Megatron-style configs say 'default'; it is AdamW here.
    "default": torch.optim.AdamW,
}


def build_optimizer(
    spec: Any, params: list[torch.nn.Parameter], fused_adam: bool = True, **kwargs: Any
) -> torch.optim.Optimizer:
    """An optimizer from a name in :data:`OPTIMIZERS` or a ``torch.optim.Optimizer`` subclass.

    ``fused_adam`` (``ExecutionOptions.fused_adam``): Adam and AdamW get torch's fused kernel
    unless ``kwargs`` choose ``fused`` or ``foreach`` themselves.

    Raises:
        ValueError: Unknown name, or a hyper-parameter outside its range
            (:data:`twinkle.model.numerics.RANGES`: ``lr`` in (0, 10], ``betas`` in [0, 1),
            ``eps`` in (0, 1], ``weight_decay`` in [0, 1], ...).
    """
    if isinstance(spec, str):
        if spec not in OPTIMIZERS:
            raise InvalidArgumentError(
                f"unknown optimizer {spec!r}; known: {', '.join(OPTIMIZERS)}"
            )
        cls = OPTIMIZERS[spec]
    elif isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        cls = spec
    else:
        raise ArgumentTypeError(
            f"optimizer must be a name or a torch.optim.Optimizer subclass, got {spec!r}"
        )
    kwargs.setdefault("lr", 1e-4)
    check_optimizer_kwargs(kwargs)
    if (
        fused_adam
        and cls in (torch.optim.Adam, torch.optim.AdamW)
        and "fused" not in kwargs
        and "foreach" not in kwargs
    ):
        # One fused kernel per step instead of several per parameter, which matters with many
        # small tenants.
        kwargs["fused"] = True
    return cls(params, **kwargs)


def _constant():
    return lambda step: 1.0


def _cosine_with_warmup(
    num_warmup_steps: int = 0, num_training_steps: int = 1000, min_lr_ratio: float = 0.0
):
    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return (step + 1) / max(1, num_warmup_steps)
        progress = min(
            1.0, (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        )
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def _linear_decay(lr_decay_steps: int = 1000, num_warmup_steps: int = 0, min_lr_ratio: float = 0.0):
    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return (step + 1) / max(1, num_warmup_steps)
        progress = min(1.0, (step - num_warmup_steps) / max(1, lr_decay_steps - num_warmup_steps))
        return 1 - (1 - min_lr_ratio) * progress

    return factor


def _linear_with_warmup(num_warmup_steps: int = 0, num_training_steps: int = 1000):
    return _linear_decay(lr_decay_steps=num_training_steps, num_warmup_steps=num_warmup_steps)


# ModelScope Twinkle's scripts name their schedulers `CosineWarmupScheduler` and
# `LinearWarmupScheduler`, with the same (num_warmup_steps, num_training_steps) arguments.
_LAMBDA_SCHEDULES = {
    "constant": _constant,
    "cosine": _cosine_with_warmup,
    "CosineWithWarmup": _cosine_with_warmup,
    "CosineWarmupScheduler": _cosine_with_warmup,
    "LinearWarmupScheduler": _linear_with_warmup,
    "default": _linear_decay,
}
SCHEDULERS = ["LinearLR", "CosineAnnealingLR", "StepLR", *_LAMBDA_SCHEDULES]


def check_scheduler_name(spec: Any) -> None:
    """Raise ``ValueError`` for an unknown scheduler name (before anything is built)."""
    if isinstance(spec, str) and spec not in SCHEDULERS:
        raise InvalidArgumentError(f"unknown lr scheduler {spec!r}; known: {', '.join(SCHEDULERS)}")


def build_scheduler(spec: Any, optimizer: torch.optim.Optimizer, **kwargs: Any):
    """A scheduler by name (see :data:`SCHEDULERS`) or a ``torch.optim.lr_scheduler`` class.

    ``LinearLR``, ``CosineAnnealingLR`` and ``StepLR`` are torch's; ``cosine`` warms up linearly
    for ``num_warmup_steps`` then follows a cosine to ``min_lr_ratio`` at ``num_training_steps``;
    ``default`` (Megatron-style) decays linearly over ``lr_decay_steps`` and takes ``max_lr`` as the
    peak learning rate.

    Raises:
        ValueError: Unknown name.
    """
    if isinstance(spec, str):
        if spec in _LAMBDA_SCHEDULES:
            max_lr = kwargs.pop("max_lr", None)
            if max_lr is not None:
                check_value("max_lr", max_lr, f"lr scheduler {spec!r}: ")
            if "min_lr_ratio" in kwargs:
                check_value("min_lr_ratio", kwargs["min_lr_ratio"], f"lr scheduler {spec!r}: ")
            if max_lr is not None:
                for group in optimizer.param_groups:
                    group["lr"] = max_lr
                    group["initial_lr"] = max_lr
            try:
                factor = _LAMBDA_SCHEDULES[spec](**kwargs)
            except TypeError as exc:  # a misspelt argument must not be silently ignored
                raise InvalidArgumentError(f"lr scheduler {spec!r}: {exc}") from None
            return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        if spec in ("LinearLR", "CosineAnnealingLR", "StepLR"):
            if spec == "CosineAnnealingLR":
                kwargs.setdefault("T_max", 1000)
            if spec == "StepLR":
                kwargs.setdefault("step_size", 100)
            return getattr(torch.optim.lr_scheduler, spec)(optimizer, **kwargs)
        raise InvalidArgumentError(f"unknown lr scheduler {spec!r}; known: {', '.join(SCHEDULERS)}")
    if isinstance(spec, type):
        return spec(optimizer, **kwargs)
    raise ArgumentTypeError(f"lr scheduler must be a name or a scheduler class, got {spec!r}")
