"""``DatasetMeta``: where a dataset comes from and which part of it to use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DataSlice = range | slice | Sequence[int]


@dataclass
class DatasetMeta:
    """Description of a dataset to load.

    Args:
        dataset_id: ``builtin://self-cognition``, ``ms://org/name``, ``hf://org/name``, or a
            local ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file or directory of them.
        subset_name: Hub subset (configuration) name, or a sub-directory of a local directory.
        split: Split to load.
        data_slice: Rows to keep, as a ``range``, ``slice`` or list of row indices. Indices past
            the end are ignored, so ``range(500)`` means "at most the first 500 rows".
        data: In-memory rows (a list of dicts) instead of ``dataset_id``.

    Raises:
        ValueError: If neither or both of ``dataset_id`` and ``data`` are given, or
            ``data_slice`` holds negative indices.
        TypeError: If ``data_slice`` is not a range, slice or list of ints.
    """

    dataset_id: str | None = None
    subset_name: str | None = None
    split: str = "train"
    data_slice: DataSlice | None = None
    data: Sequence[Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        if (self.dataset_id is None) == (self.data is None):
            raise ValueError("DatasetMeta needs exactly one of dataset_id=... or data=[...]")
        if self.data_slice is not None and not isinstance(self.data_slice, (range, slice)):
            if isinstance(self.data_slice, (str, bytes)) or not all(
                isinstance(i, int) for i in self.data_slice
            ):
                raise TypeError(
                    f"data_slice must be a range, a slice or a list of ints, got {self.data_slice!r}"
                )
            if any(i < 0 for i in self.data_slice):
                raise ValueError(f"data_slice indices must be >= 0, got {self.data_slice!r}")

    def slice_indices(self, num_rows: int) -> list[int] | None:
        """The row indices ``data_slice`` selects from ``num_rows`` rows (``None``: all rows)."""
        selection = self.data_slice
        if selection is None:
            return None
        if isinstance(selection, slice):
            return list(range(*selection.indices(num_rows)))
        return [i for i in selection if i < num_rows]

    @property
    def name(self) -> str:
        """A short label for messages: the id, or ``<in-memory>``."""
        return self.dataset_id if self.dataset_id is not None else "<in-memory>"
