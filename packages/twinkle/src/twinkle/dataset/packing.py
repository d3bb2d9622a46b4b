"""``PackingDataset``: encoded samples packed into rows of up to ``max_length`` tokens."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twinkle.dataset.base import Dataset
from twinkle.dataset.meta import DatasetMeta
from twinkle_client.dataset._packing import PackedRows, pack_lengths


class PackingDataset(PackedRows, Dataset):
    """A ``Dataset`` that, once encoded, reads as packed rows.

    After ``encode``, samples are grouped (best-fit decreasing over their lengths) into rows of
    at most the template's ``max_length`` tokens; each item is one packed ``InputFeature``:
    ``input_ids`` and ``labels`` concatenated, ``position_ids`` restarting at 0 for each sample,
    image inputs joined in order. Packing runs on first access, or when ``pack_dataset()`` is
    called; before ``encode`` the dataset reads as plain rows.

    Args:
        dataset_meta: What to load.
        packing_num_proc: Accepted for upstream scripts; packing runs in this process (it only
            sorts lengths, which is fast).
    """

    def __init__(self, dataset_meta: DatasetMeta | str, packing_num_proc: int = 1) -> None:
        super().__init__(dataset_meta)
        self.packing_num_proc = packing_num_proc
        self._packs: list[list[int]] | None = None

    def pack_dataset(self) -> None:
        """Group the encoded samples into packed rows (again after a ``filter``).

        Raises:
            RuntimeError: Not encoded yet, the rows are preference pairs, or the template has
                no ``max_length``.
        """
        if not self._encoded:
            raise RuntimeError("cannot pack: call encode() first")
        if self._paired:
            raise RuntimeError(
                f"cannot pack rows of several trajectories ({list(self._paired)}): pack "
                "single-trajectory samples"
            )
        template = self._require_template()
        if template.max_length is None:
            raise RuntimeError("cannot pack: set max_length in set_template(...)")
        self._packs = pack_lengths(list(self._data["length"]), template.max_length)

    def filter(
        self,
        fn: str | type | Callable[[Mapping[str, Any]], bool],
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
        init_args: Mapping[str, Any] | None = None,
    ) -> Dataset:
        """As ``Dataset.filter``, on the samples (not the packed rows); packs again after."""
        super().filter(fn, load_from_cache_file, num_proc, init_args)
        self._packs = None
        return self
