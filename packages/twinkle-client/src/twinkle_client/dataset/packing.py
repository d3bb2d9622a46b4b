"""``PackingDataset`` over a remote dataset: the server encodes, this client packs."""

from __future__ import annotations

from twinkle_client.dataset._packing import PackedRows, pack_lengths
from twinkle_client.dataset.meta import DatasetMeta
from twinkle_client.dataset.remote import Dataset

_FETCH = 256


class PackingDataset(PackedRows, Dataset):
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
