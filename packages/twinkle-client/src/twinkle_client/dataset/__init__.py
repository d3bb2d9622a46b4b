"""Remote datasets: ``Dataset`` loads, preprocesses and encodes rows on the server's processor.

``Dataset(dataset_meta=DatasetMeta('builtin://self-cognition'))`` works as with
``twinkle.dataset``; a local ``twinkle.dataset.Dataset`` works with remote models too.
``LazyDataset``, ``PackingDataset``, ``IterableDataset`` and ``IterablePackingDataset`` mirror
the library's: packing runs in this process over the server's encoded samples.
"""

from twinkle_client.dataset.iterable import IterableDataset, IterablePackingDataset
from twinkle_client.dataset.lazy import LazyDataset
from twinkle_client.dataset.meta import DatasetMeta
from twinkle_client.dataset.packing import PackingDataset
from twinkle_client.dataset.remote import Dataset

BUILTIN_DATASETS = ("self-cognition",)
"""Names of the datasets every server ships (``builtin://<name>``)."""

__all__ = [
    "BUILTIN_DATASETS",
    "Dataset",
    "DatasetMeta",
    "IterableDataset",
    "IterablePackingDataset",
    "LazyDataset",
    "PackingDataset",
]
