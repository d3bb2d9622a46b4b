"""Streaming datasets: rows are preprocessed, filtered and encoded one by one while iterating."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from twinkle.dataset._records import read_row
from twinkle.dataset._row_functions import encode_records, keeps, paired_columns, preprocess_row
from twinkle.dataset._sources import load_source
from twinkle.dataset.base import build_template
from twinkle.dataset.meta import DatasetMeta
from twinkle.preprocessor import get_preprocessor
from twinkle.template import Template
from twinkle_client.dataset._packing import pack_stream


class IterableDataset:
    """A dataset read as a stream: ``for sample in dataset`` (no ``len``, no indexing).

    ``map``, ``filter`` and ``encode`` are recorded and run on each row as the iteration reaches
    it, in the order they were called; a ``map`` may drop a row (``None``) or make several,
    and ``truncation_strategy='delete'`` drops over-long rows. ``DataLoader`` batches it in
    stream order (no shuffle). The source is memory-mapped by HF ``datasets``, not held in
    memory.

    Args:
        dataset_meta: What to load (a ``DatasetMeta``, or just its ``dataset_id``).
    """

    def __init__(self, dataset_meta: DatasetMeta | str) -> None:
        if isinstance(dataset_meta, str):
            dataset_meta = DatasetMeta(dataset_meta)
        self.dataset_meta = dataset_meta
        data = load_source(dataset_meta)
        indices = dataset_meta.slice_indices(len(data))
        self._data = data.select(indices) if indices is not None else data
        self._template: Template | None = None
        self._steps: list[tuple[str, Callable[[Any], Any]]] = []
        self._encoded = False
        self._add_generation_prompt = False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.dataset_meta.name!r}, steps={len(self._steps)}, "
            f"encoded={self._encoded})"
        )

    @property
    def template(self) -> Template | None:
        """The template ``encode`` uses (``None`` until ``set_template``)."""
        return self._template

    def set_template(
        self,
        template: str | type[Template] | Template,
        model_id: str | None = None,
        max_length: int | None = None,
        truncation_strategy: str = "raise",
        **kwargs: Any,
    ) -> IterableDataset:
        """Choose the chat template used by ``encode`` (arguments as ``Dataset.set_template``)."""
        self._template = build_template(template, model_id, max_length, truncation_strategy, kwargs)
        return self

    def map(
        self,
        preprocessor: str | type | Callable[[Mapping[str, Any]], Any],
        init_args: Mapping[str, Any] | None = None,
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
    ) -> IterableDataset:
        """Add a preprocessor run on each row as it streams by (arguments as ``Dataset.map``).

        Raises:
            RuntimeError: If ``encode`` was already called.
        """
        if self._encoded:
            raise RuntimeError("cannot map: the dataset is already encoded")
        self._steps.append(("map", get_preprocessor(preprocessor, init_args)))
        return self

    def filter(
        self,
        fn: str | type | Callable[[Mapping[str, Any]], bool],
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
        init_args: Mapping[str, Any] | None = None,
    ) -> IterableDataset:
        """Add a filter; after ``encode`` it sees ``InputFeature``s."""
        self._steps.append(("filter", get_preprocessor(fn, init_args)))
        return self

    def encode(
        self,
        batched: bool = True,
        num_proc: int | None = None,
        load_from_cache_file: bool = True,
        timeout: float = 600.0,
        add_generation_prompt: bool = False,
    ) -> IterableDataset:
        """Tokenise each row as it streams by (arguments as ``Dataset.encode``).

        Raises:
            RuntimeError: If no template is set, or ``encode`` was already called.
        """
        if self._encoded:
            raise RuntimeError("cannot encode: the dataset is already encoded")
        if self._template is None:
            raise RuntimeError(
                "no template: call set_template('Qwen3_5Template', model_id=...) first"
            )
        self._template.tokenizer  # noqa: B018 - fail here on a bad model id, not mid-stream
        self._steps.append(("encode", self._template.encode))
        self._encoded = True
        self._add_generation_prompt = add_generation_prompt
        return self

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._stream()

    def _stream(self) -> Iterator[dict[str, Any]]:
        for position, row in enumerate(self._data):
            yield from self._process(position, dict(row))

    def _cycle(self) -> Iterator[dict[str, Any]]:
        """The stream, restarted at its end, forever (nothing if every row is dropped)."""
        while True:
            produced = False
            for item in self._stream():
                produced = True
                yield item
            if not produced:
                return

    def _process(self, position: int, row: dict[str, Any]) -> list[dict[str, Any]]:
        items, encoded = [row], False
        for kind, fn in self._steps:
            if kind == "map":
                items = [out for it in items for out in preprocess_row(fn, position, it, True)]
            elif kind == "filter":
                items = [it for it in items if keeps(fn, position, self._view(it, encoded))]
            else:
                assert self._template is not None
                rows = encode_records(
                    self._template, items, [position] * len(items), self._add_generation_prompt
                )
                paired = paired_columns(items[0]) if items else None
                items = [read_row(r, paired, True) for r in rows if r is not None]
                encoded = True
        return [self._view(it, encoded) for it in items]

    @staticmethod
    def _view(item: dict[str, Any], encoded: bool) -> dict[str, Any]:
        return item if encoded else read_row(item, None, False)


class IterablePackingDataset(IterableDataset):
    """A streaming dataset whose encoded samples are packed into rows of up to ``max_length``
    tokens (the template's), ``packing_interval`` samples at a time.

    A packed row concatenates its samples' ``input_ids`` and ``labels`` and restarts
    ``position_ids`` at each sample (see ``twinkle_client.dataset``'s packing for the details).

    Args:
        dataset_meta: What to load.
        packing_interval: Samples gathered before each packing round.
        packing_num_proc: Accepted for upstream scripts; packing runs in this process.
        cyclic: Restart the source at its end, forever (stop the loop yourself).
    """

    def __init__(
        self,
        dataset_meta: DatasetMeta | str,
        packing_interval: int = 128,
        packing_num_proc: int = 1,
        cyclic: bool = False,
    ) -> None:
        super().__init__(dataset_meta)
        if packing_interval <= 0:
            raise ValueError(f"packing_interval must be positive, got {packing_interval}")
        self.packing_interval = packing_interval
        self.packing_num_proc = packing_num_proc
        self.cyclic = cyclic

    def pack_dataset(self) -> None:
        """Check the dataset can be packed (packing itself happens while iterating).

        Raises:
            RuntimeError: Not encoded, or the template has no ``max_length``.
        """
        self._max_length()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        max_length = self._max_length()
        stream = self._cycle() if self.cyclic else self._stream()
        yield from pack_stream(stream, max_length, self.packing_interval)

    def _max_length(self) -> int:
        if not self._encoded:
            raise RuntimeError("cannot pack: call encode() first")
        assert self._template is not None
        if self._template.max_length is None:
            raise RuntimeError("cannot pack: set max_length in set_template(...)")
        return self._template.max_length
