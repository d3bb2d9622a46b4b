"""Running a preprocessor or filter on one row, whichever way it was written.

A preprocessor may take one row (``row -> Trajectory | dict | None``) or, as upstream Twinkle
writes them, a batch of columns (``columns -> columns`` through ``map_col_to_row`` /
``map_row_to_col``). The dataset hands every callable one row wrapped in :class:`OneRow`;
``Preprocessor.map_col_to_row`` recognises it, so a batch-style function sees a batch of one,
and its columnar result is turned back into rows here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class OneRow(dict):
    """A single row handed to a preprocessor; records whether it was read as a batch."""

    read_as_batch = False


def columns_to_rows(columns: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``{'a': [1, 2], 'b': [3, 4]}`` -> ``[{'a': 1, 'b': 3}, {'a': 2, 'b': 4}]``.

    Raises:
        ValueError: Columns of different lengths.
    """
    if not columns:
        return []
    lengths = {key: len(values) for key, values in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"columns of different lengths: {lengths}")
    keys = list(columns)
    return [dict(zip(keys, values)) for values in zip(*(columns[k] for k in keys))]


def _wrap(row: Mapping[str, Any]) -> Any:
    # Only plain rows are wrapped: an ``InputFeature`` reaches a filter as itself.
    return OneRow(row) if type(row) is dict else row


def run_preprocessor(fn: Callable[[Any], Any], row: Mapping[str, Any]) -> list[Any]:
    """The rows ``fn`` makes of ``row``: none (dropped), one, or several.

    ``None`` drops the row; a ``(kept, dropped)`` pair (upstream's ``Mapper`` / ``Filter``)
    keeps ``kept``; a list is several rows; anything else is one row.
    """
    wrapped = _wrap(row)
    result = fn(wrapped)
    if result is None:
        return []
    if _is_kept_dropped(result):
        return list(result[0])
    if getattr(wrapped, "read_as_batch", False):
        if isinstance(result, Mapping) and not hasattr(result, "model_dump"):
            return columns_to_rows(result)
    return list(result) if isinstance(result, list) else [result]


def run_filter(fn: Callable[[Any], Any], row: Mapping[str, Any]) -> bool:
    """Whether ``fn`` keeps ``row`` (a bool, a one-element mask, or upstream's ``(kept,
    dropped)`` pair)."""
    wrapped = _wrap(row)
    result = fn(wrapped)
    if _is_kept_dropped(result):
        return bool(result[0])
    if isinstance(result, (list, tuple)):
        if len(result) != 1:
            raise ValueError(f"a filter given one row answered {len(result)} values")
        return bool(result[0])
    return bool(result)


def _is_kept_dropped(result: Any) -> bool:
    return (
        isinstance(result, tuple)
        and len(result) == 2
        and all(isinstance(part, list) for part in result)
    )
