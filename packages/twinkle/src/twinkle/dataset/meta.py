"""``DatasetMeta``: where a dataset comes from and which part of it to use.

Defined in ``twinkle_client.dataset.meta`` (no third-party imports) and re-exported here, so a
meta built for a local dataset also describes a remote one.
"""

from twinkle_client.dataset.meta import DatasetMeta, DataSlice

__all__ = ["DataSlice", "DatasetMeta"]
