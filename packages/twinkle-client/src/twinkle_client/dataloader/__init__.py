"""Batching: ``DataLoader`` turns a dataset (local rows or a remote ``twinkle_client.dataset.Dataset``)
into resumable, seeded batches of samples; the same class as ``twinkle.dataloader``."""

from twinkle_client.dataloader.base import DataLoader

__all__ = ["DataLoader"]
