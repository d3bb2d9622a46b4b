"""``DataLoader``: deterministic, resumable batches of samples over epochs.

Defined in ``twinkle_client.dataloader.base`` (numpy only) and re-exported here: the same class
batches local and remote datasets.
"""

from twinkle_client.dataloader.base import DataLoader

__all__ = ["DataLoader"]
