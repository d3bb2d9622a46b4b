"""``LazyDataset``: rows are preprocessed and encoded when they are read, not up front."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from twinkle.dataset._records import read_row
from twinkle.dataset._row_functions import encode_records, keeps, paired_columns, preprocess_row
from twinkle.dataset.base import Dataset
from twinkle.dataset.meta import DatasetMeta
from twinkle.preprocessor import get_preprocessor
from twinkle_client.data_format import ImagePart

_CHUNK = 256


class LazyDataset(Dataset):
    """A ``Dataset`` whose ``map`` and ``encode`` run on each row as it is read.

    Nothing is converted or tokenised up front, and the preprocessor's output is never
    written to a table, so big datasets start at once and image datasets keep their images
    (PIL, bytes) as they are until the template reads them. ``filter`` still runs at once, over
    every row, since it decides how many rows there are.

    Every ``map`` must turn one row into exactly one row: to drop rows, use ``filter``. With
    ``truncation_strategy='delete'`` an over-long row cannot be dropped at read time, and
    reading it raises; pick ``'left'`` / ``'right'`` or filter it out.

    Args:
        dataset_meta: What to load (a ``DatasetMeta``, or just its ``dataset_id``).
    """

    def __init__(self, dataset_meta: DatasetMeta | str) -> None:
        super().__init__(dataset_meta)
        self._steps: list[Callable[[Any], Any]] = []
        self._positions: list[int] | None = None  # source rows kept by filter
        self._add_generation_prompt = False

    def __repr__(self) -> str:
        return (
            f"LazyDataset({self.dataset_meta.name!r}, rows={len(self)}, "
            f"maps={len(self._steps)}, encoded={self._encoded})"
        )

    @property
    def column_names(self) -> list[str]:
        """The columns of a read row (the source's before any ``map``)."""
        if not self._steps and not self._encoded:
            return list(self._data.column_names)
        return list(self[0]) if len(self) else []

    def map(
        self,
        preprocessor: str | type | Callable[[Mapping[str, Any]], Any],
        init_args: Mapping[str, Any] | None = None,
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
    ) -> Dataset:
        """Add a preprocessor, run on each row when it is read (arguments as ``Dataset.map``;
        ``load_from_cache_file`` and ``num_proc`` have nothing to do here).

        Raises:
            ValueError: For an unknown name.
            RuntimeError: If the dataset is already encoded.
        """
        self._check_not_encoded("map")
        self._steps.append(get_preprocessor(preprocessor, init_args))
        return self

    def filter(
        self,
        fn: str | type | Callable[[Mapping[str, Any]], bool],
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
        init_args: Mapping[str, Any] | None = None,
    ) -> Dataset:
        """Keep the rows for which ``fn`` is true, deciding now (every row is read once)."""
        fn = get_preprocessor(fn, init_args)
        positions = self._source_positions()
        items = self._read(positions)
        self._positions = [p for p, item in zip(positions, items) if keeps(fn, p, item)]
        return self

    def encode(
        self,
        batched: bool = True,
        num_proc: int | None = None,
        load_from_cache_file: bool = True,
        timeout: float = 600.0,
        add_generation_prompt: bool = False,
    ) -> Dataset:
        """Tokenise each row as it is read (arguments as ``Dataset.encode``; only
        ``add_generation_prompt`` matters here).

        Raises:
            RuntimeError: If no template is set or the dataset is already encoded.
        """
        self._check_not_encoded("encode")
        self._require_template()
        self._encoded = True
        self._add_generation_prompt = add_generation_prompt
        return self

    def __len__(self) -> int:
        return len(self._positions) if self._positions is not None else len(self._data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row ``index``, preprocessed (and encoded) now."""
        if not isinstance(index, int):
            raise TypeError(f"Dataset indices must be int, got {type(index)!r}")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} rows")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Many rows, tokenised together."""
        positions = self._source_positions()
        return self._read([positions[i] for i in indices])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for start in range(0, len(self), _CHUNK):
            yield from self.__getitems__(range(start, min(start + _CHUNK, len(self))))

    def _source_positions(self) -> list[int]:
        return self._positions if self._positions is not None else list(range(len(self._data)))

    def _read(self, positions: Sequence[int]) -> list[dict[str, Any]]:
        if not positions:
            return []
        records = [self._preprocessed(p) for p in positions]
        if not self._encoded:
            return [read_row(r, None, False) for r in records]
        assert self._template is not None
        rows = encode_records(self._template, records, positions, self._add_generation_prompt)
        for position, row in zip(positions, rows):
            if row is None:
                raise ValueError(
                    f"row {position}: longer than max_length={self._template.max_length}; a "
                    "LazyDataset cannot drop it at read time (truncation_strategy='delete'): "
                    "use 'left' or 'right', or filter it out"
                )
        paired = paired_columns(records[0])
        if paired is None:
            for record, row in zip(records, rows):
                _keep_image_files(record, row)
        return [read_row(r, paired, True) for r in rows]

    def _preprocessed(self, position: int) -> dict[str, Any]:
        record = dict(self._data[position])
        for fn in self._steps:
            out = preprocess_row(fn, position, record, live=True)
            if len(out) != 1:
                raise ValueError(
                    f"row {position}: {fn!r} made {len(out)} rows of it; in a LazyDataset every "
                    "map keeps one row per row (drop rows with filter(...) instead)"
                )
            record = out[0]
        return record


def _keep_image_files(record: Mapping[str, Any], row: dict[str, Any]) -> None:
    """Keep an image-text row's image files (PNG bytes, in order) beside their pixels: a Tinker
    datum carries images as files (``input_feature_to_datum``). Rows read lazily only; the
    trainer leaves the field out."""
    if row.get("pixel_values") is None:
        return
    images = []
    for message in record.get("messages") or []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            images += [ImagePart.model_validate(p).image_bytes() for p in content if _is_image(p)]
    row["images"] = images


def _is_image(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "image"
