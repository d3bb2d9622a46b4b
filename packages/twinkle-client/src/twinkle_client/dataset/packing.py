"""``PackingDataset`` over a remote dataset: the server encodes, this client packs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from twinkle_client.dataset._packing import pack_features, pack_lengths
from twinkle_client.dataset.meta import DatasetMeta
from twinkle_client.dataset.remote import Dataset

_CHUNK = 64
_FETCH = 256


class PackingDataset(Dataset):
    """A remote dataset that, once encoded, reads as packed rows of up to ``max_length`` tokens
    (the ``max_length`` given to ``set_template``), as ``twinkle.dataset.PackingDataset``.

    Packing runs here: ``pack_dataset()`` (or the first access after ``encode``) reads every
    sample's length once, and each packed row fetches its samples in one request.

    Args:
        dataset_meta: What to load.
        packing_num_proc: Accepted for upstream scripts; packing runs in this process.
    """

    def __init__(self, dataset_meta: DatasetMeta | str, packing_num_proc: int = 1) -> None:
        super().__init__(dataset_meta)
        self.packing_num_proc = packing_num_proc
        self._packs: list[list[int]] | None = None

    def pack_dataset(self) -> None:
        """Group the encoded samples into packed rows.

        Raises:
            RuntimeError: Not encoded yet, or ``set_template`` was given no ``max_length``.
        """
        if not self._encoded:
            raise RuntimeError("cannot pack: call encode() first")
        if self._max_length is None:
            raise RuntimeError("cannot pack: set max_length in set_template(...)")
        total = Dataset.__len__(self)
        lengths = []
        for start in range(0, total, _FETCH):
            chunk = Dataset.__getitems__(self, range(start, min(start + _FETCH, total)))
            lengths += [int(sample["length"]) for sample in chunk]
        self._packs = pack_lengths(lengths, self._max_length)

    def __len__(self) -> int:
        return len(self._packed()) if self._encoded else super().__len__()

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Packed row ``index`` once encoded, otherwise row ``index``."""
        if not self._encoded:
            return super().__getitem__(index)
        if not isinstance(index, int):
            raise TypeError(f"Dataset indices must be int, got {type(index)!r}")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} packed rows")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Many (packed) rows, their samples fetched in one request."""
        if not self._encoded:
            return super().__getitems__(indices)
        packs = self._packed()
        groups = [packs[i] for i in indices]
        samples = super().__getitems__([i for group in groups for i in group])
        out: list[dict[str, Any]] = []
        start = 0
        for group in groups:
            out.append(pack_features(samples[start : start + len(group)]))
            start += len(group)
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self._encoded:
            yield from super().__iter__()
            return
        for start in range(0, len(self), _CHUNK):
            yield from self.__getitems__(range(start, min(start + _CHUNK, len(self))))

    def _packed(self) -> list[list[int]]:
        if self._packs is None:
            self.pack_dataset()
        assert self._packs is not None
        return self._packs
