"""Datasets: load rows, preprocess them into trajectories, encode them into ``InputFeature``s.

``Dataset(dataset_meta=DatasetMeta('builtin://self-cognition'))`` loads the shipped
self-cognition data; ``ms://``, ``hf://``, local files and in-memory rows work the same way.
``LazyDataset`` preprocesses and encodes rows when they are read, ``PackingDataset`` packs
encoded samples into rows of up to ``max_length`` tokens, and ``IterableDataset`` /
``IterablePackingDataset`` stream.
"""

from twinkle.dataset._sources import BUILTIN_DATASETS
from twinkle.dataset.base import Dataset
from twinkle.dataset.iterable import IterableDataset, IterablePackingDataset
from twinkle.dataset.lazy import LazyDataset
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.packing import PackingDataset

__all__ = [
    "BUILTIN_DATASETS",
    "Dataset",
    "DatasetMeta",
    "IterableDataset",
    "IterablePackingDataset",
    "LazyDataset",
    "PackingDataset",
]
