"""Datasets: load rows, preprocess them into trajectories, encode them into ``InputFeature``s.

``Dataset(dataset_meta=DatasetMeta('builtin://self-cognition'))`` loads the shipped
self-cognition data; ``ms://``, ``hf://``, local files and in-memory rows work the same way.
"""

from twinkle.dataset._sources import BUILTIN_DATASETS
from twinkle.dataset.base import Dataset
from twinkle.dataset.meta import DatasetMeta

__all__ = ["BUILTIN_DATASETS", "Dataset", "DatasetMeta"]
