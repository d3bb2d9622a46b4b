"""``Preprocessor``: turns raw dataset rows into trajectories; ``DataFilter``: keeps or drops."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from twinkle.errors import MissingFieldError
from twinkle.preprocessor._rows import OneRow, columns_to_rows


class Preprocessor:
    """Callable that maps a raw row to a trajectory (a ``Trajectory`` or a dict with
    ``messages``), or to ``None`` to drop the row.

    Subclasses list the row fields they need in ``required_fields`` (checked before ``process``
    runs, so a malformed row fails with the field's name) and implement ``process`` (or
    ``preprocess``, upstream Twinkle's name for the same method).

    A subclass may instead override ``__call__`` to take a batch of columns, as upstream's do:
    ``rows = self.map_col_to_row(rows)``, convert each row, ``return self.map_row_to_col(rows)``.
    ``Dataset.map`` runs both kinds.

    Example:
        >>> class Echo(Preprocessor):
        ...     required_fields = ("text",)
        ...     def process(self, row):
        ...         return {"messages": [{"role": "user", "content": row["text"]}]}
    """

    required_fields: ClassVar[tuple[str, ...]] = ()

    def __call__(self, row: Mapping[str, Any]) -> Any:
        """Check the row's required fields, then ``process`` it.

        Raises:
            MissingFieldError: If a required field is absent or ``None``.
        """
        for field in self.required_fields:
            if row.get(field) is None:
                raise MissingFieldError(field, f"missing field {field!r} needed by {self!r}")
        return self.process(row)

    def process(self, row: Mapping[str, Any]) -> Any:
        """Convert a row whose required fields are present; override in subclasses."""
        return self.preprocess(row)

    def preprocess(self, row: Mapping[str, Any]) -> Any:
        """Upstream Twinkle's name for ``process``; override either one."""
        raise NotImplementedError(
            f"{type(self).__name__} implements neither process nor preprocess"
        )

    @staticmethod
    def map_col_to_row(rows: Mapping[str, Sequence[Any]] | list[Any]) -> list[Any]:
        """A batch of columns as a list of row dicts (a list passes through).

        Raises:
            ValueError: Columns of different lengths.
        """
        if isinstance(rows, OneRow):
            rows.read_as_batch = True
            return [dict(rows)]
        if isinstance(rows, list):
            return rows
        return columns_to_rows(rows)

    @staticmethod
    def map_row_to_col(
        rows: list[Any] | Mapping[str, Any], keys: Sequence[str] | None = None
    ) -> dict[str, list[Any]]:
        """Rows (dicts, ``Trajectory``s) as a batch of columns: every key of any row (plus
        ``keys``) becomes a column, ``None`` where a row lacks it. A mapping passes through."""
        if isinstance(rows, Mapping):
            return dict(rows)
        names = list(keys or [])
        for row in rows:
            names += [k for k in row.keys() if k not in names]
        return {name: [_field(row, name) for row in rows] for name in names}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _field(row: Any, name: str) -> Any:
    return row.get(name) if hasattr(row, "get") else getattr(row, name, None)


class DataFilter:
    """Callable that decides whether ``Dataset.filter`` keeps a row: override ``__call__``."""

    def __call__(self, row: Mapping[str, Any]) -> bool:
        """``True`` to keep ``row``."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(row) -> bool")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Mapper(Preprocessor):
    """A step that changes rows and never drops one: override ``map(row) -> row``.

    Called with a batch it returns ``(rows, [])``, upstream's ``(kept, dropped)`` form.
    """

    def map(self, row: dict[str, Any]) -> dict[str, Any]:
        """The changed row."""
        raise NotImplementedError(f"{type(self).__name__} must implement map(row)")

    def __call__(self, rows: Any) -> tuple[list[Any], list[Any]]:  # type: ignore[override]
        return [self.map(row) for row in self.map_col_to_row(rows)], []


class Filter(Preprocessor):
    """A step that keeps some rows: override ``keep(row) -> bool`` (and ``drop_reason``).

    Called with a batch it returns ``(kept, dropped)``; each dropped row carries a
    ``drop_reason``. ``Dataset.map`` and ``Dataset.filter`` both accept it.
    """

    def keep(self, row: dict[str, Any]) -> bool:
        """Whether ``row`` stays."""
        raise NotImplementedError(f"{type(self).__name__} must implement keep(row)")

    def drop_reason(self, row: dict[str, Any]) -> str:
        """A short tag saying why ``row`` was dropped (the class name by default)."""
        return type(self).__name__

    def __call__(self, rows: Any) -> tuple[list[Any], list[Any]]:  # type: ignore[override]
        kept, dropped = [], []
        for row in self.map_col_to_row(rows):
            if self.keep(row):
                kept.append(row)
            else:
                dropped.append({**row, "drop_reason": self.drop_reason(row)})
        return kept, dropped
