"""Batching: ``DataLoader`` turns a dataset into resumable, seeded batches of samples."""

from twinkle.dataloader.base import DataLoader

__all__ = ["DataLoader"]
