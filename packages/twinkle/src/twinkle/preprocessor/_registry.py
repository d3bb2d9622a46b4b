"""Name -> preprocessor class registry, so ``Dataset.map('SelfCognitionProcessor', ...)`` works."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from twinkle.errors import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:
    from twinkle.preprocessor.base import Preprocessor

_PREPROCESSORS: dict[str, type[Preprocessor]] = {}

RowFunction = Callable[[Mapping[str, Any]], "dict[str, Any] | None"]


def register_preprocessor(cls: type[Preprocessor]) -> type[Preprocessor]:
    """Class decorator: make ``cls`` available by its class name."""
    _PREPROCESSORS[cls.__name__] = cls
    return cls


def list_preprocessors() -> list[str]:
    """The registered preprocessor names, sorted."""
    return sorted(_PREPROCESSORS)


def get_preprocessor(
    preprocessor: str | type | RowFunction, init_args: Mapping[str, Any] | None = None
) -> RowFunction:
    """Resolve a name, class, instance or plain function to a row function.

    Args:
        preprocessor: A registered name (``'AlpacaProcessor'``), a class (built with
            ``init_args``), a ``Preprocessor`` instance, or any ``row -> dict | None`` callable.
        init_args: Constructor keyword arguments for a name or class.

    Raises:
        ValueError: If the name is not registered (the message lists the known names).
        TypeError: If ``init_args`` is given for something that is not built here, or the value
            is not callable.
    """
    if isinstance(preprocessor, str):
        if preprocessor not in _PREPROCESSORS:
            raise InvalidArgumentError(
                f"unknown preprocessor {preprocessor!r}; known preprocessors: "
                f"{list_preprocessors()}"
            )
        preprocessor = _PREPROCESSORS[preprocessor]
    if isinstance(preprocessor, type):
        return preprocessor(**dict(init_args or {}))
    if init_args:
        raise ArgumentTypeError(
            f"init_args only apply to a preprocessor name or class, not {preprocessor!r}"
        )
    if not callable(preprocessor):
        raise ArgumentTypeError(f"a preprocessor must be callable, got {type(preprocessor)!r}")
    return preprocessor
