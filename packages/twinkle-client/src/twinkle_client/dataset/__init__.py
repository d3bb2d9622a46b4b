"""Remote datasets: ``Dataset`` loads, preprocesses and encodes rows on the server's processor.

``Dataset(dataset_meta=DatasetMeta('builtin://self-cognition'))`` works as with
``twinkle.dataset``; a local ``twinkle.dataset.Dataset`` works with remote models too.
"""

from twinkle_client.dataset.meta import DatasetMeta
from twinkle_client.dataset.remote import Dataset

BUILTIN_DATASETS = ("self-cognition",)
"""Names of the datasets every server ships (``builtin://<name>``)."""

__all__ = ["BUILTIN_DATASETS", "Dataset", "DatasetMeta"]
