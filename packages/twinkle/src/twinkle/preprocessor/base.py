"""``Preprocessor``: turns one raw dataset row into a trajectory dict (or drops it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class MissingFieldError(ValueError):
    """A row lacks a field its preprocessor needs.

    Attributes:
        field: The missing field's name.
    """

    def __init__(self, field: str, message: str | None = None) -> None:
        super().__init__(message or f"missing field {field!r}")
        self.field = field


class Preprocessor:
    """Callable that maps a raw row to ``{'messages': [...], 'extra': {...}}`` or ``None``.

    Subclasses list the row fields they need in ``required_fields`` (checked before ``process``
    runs, so a malformed row fails with the field's name) and implement ``process``. Returning
    ``None`` drops the row.

    Example:
        >>> class Echo(Preprocessor):
        ...     required_fields = ("text",)
        ...     def process(self, row):
        ...         return {"messages": [{"role": "user", "content": row["text"]}]}
    """

    required_fields: ClassVar[tuple[str, ...]] = ()

    def __call__(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        """Check the row's required fields, then ``process`` it.

        Raises:
            MissingFieldError: If a required field is absent or ``None``.
        """
        for field in self.required_fields:
            if row.get(field) is None:
                raise MissingFieldError(field, f"missing field {field!r} needed by {self!r}")
        return self.process(row)

    def process(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        """Convert a row whose required fields are present; override in subclasses."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
