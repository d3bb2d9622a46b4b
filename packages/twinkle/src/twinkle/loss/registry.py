"""Name-to-class registry of losses, so servers and configs can refer to losses by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from twinkle.errors import ArgumentTypeError, InvalidArgumentError
from twinkle.loss.base import Loss

_REGISTRY: dict[str, type[Loss]] = {}


def register_loss(name: str) -> Callable[[type[Loss]], type[Loss]]:
    """Class decorator registering a :class:`Loss` subclass under ``name``.

    Args:
        name: the name :func:`get_loss` will accept.

    Returns:
        The decorator; it sets ``cls.name`` and returns the class unchanged.

    Raises:
        TypeError: if the decorated object is not a Loss subclass.
        ValueError: if ``name`` is already taken by another class (a silent override would
            change what every tenant using that name trains with).
    """

    def decorator(cls: type[Loss]) -> type[Loss]:
        if not (isinstance(cls, type) and issubclass(cls, Loss)):
            raise ArgumentTypeError(f"register_loss({name!r}) expects a Loss subclass, got {cls!r}")
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise InvalidArgumentError(
                f"a loss named {name!r} is already registered ({existing.__name__})"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def register_alias(alias: str, name: str) -> None:
    """Let :func:`get_loss` accept ``alias`` for the loss registered as ``name`` (the class keeps
    its own name, which is what ``get_train_configs`` reports).

    Raises:
        InvalidArgumentError: ``name`` is not registered, or ``alias`` names another class.
    """
    cls = _REGISTRY.get(name)
    if cls is None:
        raise InvalidArgumentError(f"cannot alias {alias!r} to the unknown loss {name!r}")
    existing = _REGISTRY.get(alias)
    if existing is not None and existing is not cls:
        raise InvalidArgumentError(
            f"a loss named {alias!r} is already registered ({existing.__name__})"
        )
    _REGISTRY[alias] = cls


def known_losses() -> list[str]:
    """Return the registered loss names, sorted."""
    return sorted(_REGISTRY)


def loss_class(spec: Any) -> type[Loss] | None:
    """The Loss class ``spec`` names (a registered name or alias, a class, an instance), or None."""
    if isinstance(spec, Loss):
        return type(spec)
    if isinstance(spec, type) and issubclass(spec, Loss):
        return spec
    return _REGISTRY.get(spec) if isinstance(spec, str) else None


def get_loss(spec: str | type[Loss] | Loss, **kwargs) -> Loss:
    """Build a loss from a registered name, a Loss subclass, or pass an instance through.

    Args:
        spec: a registered name (e.g. ``'GRPOLoss'``, ``'ppo'``), a Loss subclass or an instance.
        **kwargs: constructor arguments; not allowed with an instance.

    Returns:
        A ready Loss instance.

    Raises:
        InvalidArgumentError: for an unknown name (the message lists the known names) or a bad
            argument value.
        ArgumentTypeError: for an argument the loss does not take, kwargs given with an
            instance, or a spec of another type.
    """
    if isinstance(spec, Loss):
        if kwargs:
            raise ArgumentTypeError(
                f"get_loss got an already built {type(spec).__name__} and kwargs {sorted(kwargs)}"
            )
        return spec
    if isinstance(spec, type) and issubclass(spec, Loss):
        return _build(spec, spec.__name__, kwargs)
    if isinstance(spec, str):
        cls = _REGISTRY.get(spec)
        if cls is None:
            raise InvalidArgumentError(
                f"unknown loss {spec!r}; known losses: {', '.join(known_losses())}"
            )
        return _build(cls, spec, kwargs)
    raise ArgumentTypeError(f"get_loss expects a name, a Loss subclass or a Loss, got {spec!r}")


def _build(cls: type[Loss], label: str, kwargs: dict[str, Any]) -> Loss:
    """``cls(**kwargs)``, its arguments checked first so that a misspelt or unknown one is the
    caller's mistake (naming it and the accepted ones), not a TypeError from inside."""
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        accepted = [
            p.name
            for p in inspect.signature(cls).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        raise ArgumentTypeError(
            f"loss {label!r}: {exc}; it accepts: {', '.join(accepted) or 'no arguments'}"
        ) from None
    try:
        return cls(**kwargs)
    except InvalidArgumentError:
        raise
    except ValueError as exc:
        raise InvalidArgumentError(f"loss {label!r}: {exc}") from None


def loss_from_spec(spec: str | dict | type[Loss] | Loss) -> Loss:
    """A per-request loss: a name, ``{'name': ..., **config}``, a Loss subclass or an instance."""
    if isinstance(spec, dict):
        config = dict(spec)
        if "name" not in config:
            raise InvalidArgumentError("a loss given as an object needs its 'name'")
        return get_loss(config.pop("name"), **config)
    return get_loss(spec)
