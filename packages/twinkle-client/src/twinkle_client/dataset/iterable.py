"""Streaming over a remote dataset: ``IterableDataset`` and ``IterablePackingDataset``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from twinkle_client.dataset._packing import pack_stream
from twinkle_client.dataset.meta import DatasetMeta
from twinkle_client.dataset.remote import Dataset

if TYPE_CHECKING:
    # Through remote.py, whose type-only import of the library is the one the layering allows.
    from twinkle_client.dataset.remote import Template


class IterableDataset:
    """A remote dataset read as a stream (no ``len``, no indexing), as
    ``twinkle.dataset.IterableDataset``: the server holds and encodes the rows, and iteration
    fetches them a chunk per request. ``map`` and ``filter`` take what the remote ``Dataset``
    takes (registered names only).

    Args:
        dataset_meta: What to load.
    """

    def __init__(self, dataset_meta: DatasetMeta | str) -> None:
        self._rows = Dataset(dataset_meta)
        self.dataset_meta = self._rows.dataset_meta

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dataset_meta.name!r}, remote=True)"

    @property
    def template(self) -> str | None:
        """The name of the template ``encode`` uses (``None`` until ``set_template``)."""
        return self._rows.template

    def set_template(
        self,
        template: str | type[Template] | Template,
        model_id: str | None = None,
        max_length: int | None = None,
        truncation_strategy: str = "raise",
        **kwargs: Any,
    ) -> IterableDataset:
        """As ``twinkle_client.dataset.Dataset.set_template``."""
        self._rows.set_template(template, model_id, max_length, truncation_strategy, **kwargs)
        return self

    def map(
        self,
        preprocessor: str | type | Callable[[Mapping[str, Any]], Any],
        init_args: Mapping[str, Any] | None = None,
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
    ) -> IterableDataset:
        """As ``twinkle_client.dataset.Dataset.map``."""
        self._rows.map(preprocessor, init_args, load_from_cache_file, num_proc)
        return self

    def filter(
        self,
        fn: str | type | Callable[[Mapping[str, Any]], bool],
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
        init_args: Mapping[str, Any] | None = None,
    ) -> IterableDataset:
        """As ``twinkle_client.dataset.Dataset.filter`` (not available remotely)."""
        self._rows.filter(fn, load_from_cache_file, num_proc, init_args)
        return self

    def encode(
        self,
        batched: bool = True,
        num_proc: int | None = None,
        load_from_cache_file: bool = True,
        timeout: float = 600.0,
        add_generation_prompt: bool = False,
    ) -> IterableDataset:
        """As ``twinkle_client.dataset.Dataset.encode``."""
        self._rows.encode(batched, num_proc, load_from_cache_file, timeout, add_generation_prompt)
        return self

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)


class IterablePackingDataset(IterableDataset):
    """A remote stream packed here into rows of up to ``max_length`` tokens (the one given to
    ``set_template``), ``packing_interval`` samples at a time, as
    ``twinkle.dataset.IterablePackingDataset``.

    Args:
        dataset_meta: What to load.
        packing_interval: Samples gathered before each packing round.
        packing_num_proc: Accepted for upstream scripts; packing runs in this process.
        cyclic: Restart the stream at its end, forever (stop the loop yourself).
    """

    def __init__(
        self,
        dataset_meta: DatasetMeta | str,
        packing_interval: int = 128,
        packing_num_proc: int = 1,
        cyclic: bool = False,
    ) -> None:
        if packing_interval <= 0:
            raise ValueError(f"packing_interval must be positive, got {packing_interval}")
        super().__init__(dataset_meta)
        self.packing_interval = packing_interval
        self.packing_num_proc = packing_num_proc
        self.cyclic = cyclic

    def pack_dataset(self) -> None:
        """Check the dataset can be packed (packing itself happens while iterating).

        Raises:
            RuntimeError: Not encoded, or ``set_template`` was given no ``max_length``.
        """
        self._max_length()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        max_length = self._max_length()
        yield from pack_stream(self._samples(), max_length, self.packing_interval)

    def _samples(self) -> Iterator[dict[str, Any]]:
        while True:
            yield from self._rows
            if not self.cyclic or not len(self._rows):
                return

    def _max_length(self) -> int:
        if not self._rows._encoded:
            raise RuntimeError("cannot pack: call encode() first")
        if self._rows._max_length is None:
            raise RuntimeError("cannot pack: set max_length in set_template(...)")
        return self._rows._max_length
