"""The strict base model of every config section, and cross-field errors with precise paths."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError


class StrictModel(BaseModel):
    """A config section: unknown keys are errors, values are re-validated on assignment, and an
    integer field takes an integer only (``port: "8000"``, a YAML string, or ``true`` is an
    error naming the field, not silently converted)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _integers_are_integers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        problems = [
            (
                (name,),
                f"expected an integer, got {type(value).__name__} {value!r}"
                + (" (write the number without quotes)" if isinstance(value, str) else ""),
            )
            for name, field in cls.model_fields.items()
            if name in data
            and _is_int_field(field.annotation)
            and isinstance(value := data[name], (str, bool))
        ]
        raise_if(f"{cls.__name__} types", problems, data)
        return data


def _is_int_field(annotation: Any) -> bool:
    """``int`` or ``int | None`` (not a union with other types, e.g. ``int | str``)."""
    if annotation is int:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args == [int]
    return False


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
