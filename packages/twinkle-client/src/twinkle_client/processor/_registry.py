"""Name -> processor class registry, for ``model.set_processor('InputProcessor', ...)``."""

from __future__ import annotations

from typing import Any

from twinkle_client.processor.base import InputProcessor

_PROCESSORS: dict[str, type] = {"InputProcessor": InputProcessor}


def register_processor(cls: type) -> type:
    """Class decorator: make ``cls`` available to ``get_processor`` by its class name."""
    _PROCESSORS[cls.__name__] = cls
    return cls


def list_processors() -> list[str]:
    """The registered processor names, sorted."""
    return sorted(_PROCESSORS)


def get_processor(processor: str | type | Any, **kwargs: Any) -> Any:
    """Build a processor from a registered name or a class, or pass an instance through.

    Raises:
        ValueError: If the name is not registered (the message lists the known names).
        TypeError: If arguments are given together with an instance.
    """
    if isinstance(processor, str):
        if processor not in _PROCESSORS:
            raise ValueError(
                f"unknown processor {processor!r}; known processors: {list_processors()}"
            )
        processor = _PROCESSORS[processor]
    if isinstance(processor, type):
        return processor(**kwargs)
    if kwargs:
        raise TypeError(f"cannot apply {sorted(kwargs)} to an already built {processor!r}")
    return processor
