"""The strict base model of every config section, and cross-field errors with precise paths."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError


class StrictModel(BaseModel):
    """A config section: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def fail(
    title: str, problems: Iterable[tuple[tuple[str | int, ...], str]], data: Any = None
) -> NoReturn:
    """Raise a ``ValidationError`` with one entry per ``(loc, message)``.

    Raised from a validator, pydantic prefixes each ``loc`` with the path of the model being
    validated, so a cross-field error names the exact field (``persistence.redis_url``) rather
    than the section.
    """
    details = [
        InitErrorDetails(type=PydanticCustomError("config", message), loc=loc, input=data)
        for loc, message in problems
    ]
    raise ValidationError.from_exception_data(title, details)


def raise_if(title: str, problems: list[tuple[tuple[str | int, ...], str]], data: Any) -> None:
    """``fail`` when ``problems`` is not empty."""
    if problems:
        fail(title, problems, data)
