"""Numpy optimizers and learning-rate schedules for the mock backend."""

from __future__ import annotations

import math

import numpy as np

from twinkle.errors import InvalidArgumentError
from twinkle.model.numerics import check_optimizer_kwargs

_OPTIMIZERS = ("Adam", "AdamW", "SGD")
_ALIASES = {"default": "Adam", "adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


class NumpyOptimizer:
    """Adam, AdamW (decoupled weight decay) or SGD with momentum over a dict of arrays.

    Args:
        name: ``'Adam'``, ``'AdamW'``, ``'SGD'`` (``'default'`` means Adam).
        lr: base learning rate.
        **kwargs: ``betas`` (or ``beta1``/``beta2``), ``eps``, ``weight_decay``, ``momentum``.

    Raises:
        ValueError: for an unknown optimizer or option.
    """

    def __init__(self, name: str, lr: float = 1e-4, **kwargs):
        self.name = _ALIASES.get(name, name)
        if self.name not in _OPTIMIZERS:
            raise InvalidArgumentError(
                f"unknown optimizer {name!r}; the mock supports {_OPTIMIZERS}"
            )
        check_optimizer_kwargs({"lr": lr, **kwargs})
        betas = kwargs.pop("betas", (kwargs.pop("beta1", 0.9), kwargs.pop("beta2", 0.999)))
        self.lr = float(lr)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(kwargs.pop("eps", 1e-8))
        default_wd = 0.01 if self.name == "AdamW" else 0.0
        self.weight_decay = float(kwargs.pop("weight_decay", default_wd))
        self.momentum = float(kwargs.pop("momentum", 0.0))
        if kwargs:
            raise InvalidArgumentError(
                f"unsupported options for optimizer {self.name!r}: {sorted(kwargs)}"
            )
        self.state: dict[str, np.ndarray] = {}
        self.steps = 0

    def config(self) -> dict:
        """Return what rebuilds this optimizer (without its state)."""
        return {
            "name": self.name,
            "lr": self.lr,
            "betas": list(self.betas),
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "momentum": self.momentum,
        }

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray], lr: float) -> None:
        """Update ``params`` in place from ``grads`` at learning rate ``lr``."""
        self.steps += 1
        for key, param in params.items():
            grad = grads[key]
            if self.name == "SGD":
                self._sgd(key, param, grad, lr)
            else:
                self._adam(key, param, grad, lr)

    def _sgd(self, key: str, param: np.ndarray, grad: np.ndarray, lr: float) -> None:
        grad = grad + self.weight_decay * param
        if self.momentum:
            buf = self.state.get(f"{key}.momentum", np.zeros_like(param))
            buf = self.momentum * buf + grad
            self.state[f"{key}.momentum"] = buf
            grad = buf
        param -= lr * grad

    def _adam(self, key: str, param: np.ndarray, grad: np.ndarray, lr: float) -> None:
        beta1, beta2 = self.betas
        if self.name == "AdamW":
            param *= 1 - lr * self.weight_decay
        else:
            grad = grad + self.weight_decay * param
        m = beta1 * self.state.get(f"{key}.exp_avg", np.zeros_like(param)) + (1 - beta1) * grad
        v = beta2 * self.state.get(f"{key}.exp_avg_sq", np.zeros_like(param)) + (
            1 - beta2
        ) * np.square(grad)
        self.state[f"{key}.exp_avg"], self.state[f"{key}.exp_avg_sq"] = m, v
        m_hat = m / (1 - beta1**self.steps)
        v_hat = v / (1 - beta2**self.steps)
        param -= lr * m_hat / (np.sqrt(v_hat) + self.eps)


class LRSchedule:
    """Learning rate as a function of the optimizer step.

    Names: ``'constant'``; ``'LinearLR'`` (torch semantics: ``start_factor`` 1/3 to
    ``end_factor`` 1.0 over ``total_iters`` 5); ``'cosine'``/``'CosineAnnealingLR'`` (to
    ``eta_min`` over ``T_max``, also read as ``num_training_steps``/``lr_decay_steps``, default
    1000); ``'default'`` (Megatron style: cosine from ``max_lr`` to ``min_lr`` over
    ``lr_decay_steps``).

    Raises:
        ValueError: for an unknown schedule.
    """

    _NAMES = ("constant", "LinearLR", "cosine", "CosineAnnealingLR", "default")

    def __init__(self, name: str = "constant", **kwargs):
        if name not in self._NAMES:
            raise InvalidArgumentError(
                f"unknown lr scheduler {name!r}; the mock supports {self._NAMES}"
            )
        self.name = name
        self.kwargs = dict(kwargs)

    def lr_at(self, base_lr: float, step: int) -> float:
        """Return the learning rate used for the update after ``step`` completed updates."""
        kw = self.kwargs
        if self.name == "constant":
            return base_lr
        if self.name == "LinearLR":
            start, end = kw.get("start_factor", 1 / 3), kw.get("end_factor", 1.0)
            total = max(int(kw.get("total_iters", 5)), 1)
            return base_lr * (start + (end - start) * min(step, total) / total)
        span = kw.get("T_max", kw.get("num_training_steps", kw.get("lr_decay_steps", 1000)))
        progress = min(step, span) / max(span, 1)
        top = kw.get("max_lr", base_lr) if self.name == "default" else base_lr
        floor = kw.get("min_lr", 0.0) if self.name == "default" else kw.get("eta_min", 0.0)
        return floor + (top - floor) * 0.5 * (1 + math.cos(math.pi * progress))
