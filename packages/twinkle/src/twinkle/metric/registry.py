"""Name-to-class registry of model-attached metrics, so a server builds them by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twinkle.errors import ArgumentTypeError, InvalidArgumentError
from twinkle.metric.base import Metric

_REGISTRY: dict[str, type[Metric]] = {}
_CLIENT_SIDE = {"CompletionRewardMetric"}


def register_metric(name: str) -> Callable[[type[Metric]], type[Metric]]:
    """Class decorator registering a model-attached :class:`Metric` subclass under ``name``.

    Raises:
        ArgumentTypeError: the decorated object is not a Metric subclass.
        InvalidArgumentError: ``name`` is taken by another class.
    """

    def decorator(cls: type[Metric]) -> type[Metric]:
        if not (isinstance(cls, type) and issubclass(cls, Metric)):
            raise ArgumentTypeError(f"register_metric({name!r}) expects a Metric subclass")
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise InvalidArgumentError(
                f"a metric named {name!r} is already registered ({existing.__name__})"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def known_metrics() -> list[str]:
    """The registered (model-attachable) metric names, sorted."""
    return sorted(_REGISTRY)


def get_metric(spec: str | type[Metric], **kwargs: Any) -> Metric:
    """Build a model-attached metric from its registered name or class.

    Args:
        spec: ``'DPOMetric'``, ``'GRPOMetric'``, ... or the class itself.
        **kwargs: Constructor arguments (``beta=0.1``, ...).

    Raises:
        InvalidArgumentError: an unknown name, a client-side metric, or constructor arguments
            the metric does not take (the message names them).
        ArgumentTypeError: a spec that is neither a name nor a Metric subclass.
    """
    if isinstance(spec, type) and issubclass(spec, Metric):
        cls, name = spec, spec.__name__
    elif isinstance(spec, str):
        name = spec
        if name in _CLIENT_SIDE:
            raise InvalidArgumentError(
                f"{name} is computed in the training script (metric.accumulate(...)), "
                f"it cannot be attached to a model"
            )
        cls = _REGISTRY.get(name)
        if cls is None:
            raise InvalidArgumentError(
                f"unknown metric {name!r}; known metrics: {', '.join(known_metrics())}"
            )
    else:
        raise ArgumentTypeError(f"get_metric expects a name or a Metric subclass, got {spec!r}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise InvalidArgumentError(f"{name}: {exc}") from exc
