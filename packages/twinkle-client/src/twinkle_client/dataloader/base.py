"""``DataLoader``: deterministic, resumable batches of samples over epochs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

_END = object()


class DataLoader:
    """Yields lists of samples (``InputFeature``s after ``Dataset.encode``) in batches.

    Each new ``iter()`` continues where the last one stopped: a finished pass starts the next
    epoch, an interrupted one resumes mid-epoch. With ``shuffle`` the order of epoch ``e`` is a
    permutation seeded by ``seed + e``, so it is the same on every run and after a resume.
    Batches are lists, not tensors: padding and collation belong to the model's processor, which
    may run on a remote server.

    A dataset without ``len`` (``IterableDataset``, any iterable) is batched in stream order:
    no shuffle, ``len(loader)`` is a ``TypeError``, each ``iter()`` restarts the stream, and a
    resume skips the samples already consumed.

    Args:
        dataset: Any sequence of samples (a ``Dataset``, a list...) or an iterable of them.
        batch_size: Samples per batch.
        shuffle: Visit samples in a seeded random order per epoch.
        seed: Base seed of the shuffle.
        drop_last: Skip the last, smaller batch of each epoch.
        num_workers: Accepted for scripts written for torch's loader; batches are read in this
            process (a remote dataset is read a whole batch per request).

    Raises:
        ValueError: If ``batch_size`` is not positive, ``num_workers`` is negative, or
            ``shuffle`` is asked of a dataset without ``len``.
    """

    def __init__(
        self,
        dataset: Sequence[Any],
        batch_size: int,
        shuffle: bool = False,
        seed: int = 42,
        drop_last: bool = False,
        num_workers: int = 0,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.streaming = not hasattr(dataset, "__len__")
        if self.streaming and shuffle:
            raise ValueError("shuffle needs a dataset with len(); a streaming dataset has none")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_workers = num_workers
        self._epoch = 0
        self._offset = 0  # samples of the current epoch already yielded
        self._consumed = 0

    def __len__(self) -> int:
        """Batches per epoch.

        Raises:
            TypeError: For a streaming dataset (it has no length).
        """
        if self.streaming:
            raise TypeError("a DataLoader over a streaming dataset has no len()")
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def samples_per_epoch(self) -> int:
        """Samples yielded in one full epoch (fewer than the dataset with ``drop_last``)."""
        n = len(self.dataset)
        return n - n % self.batch_size if self.drop_last else n

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The sample indices of ``epoch``, in the order they are yielded."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng(self.seed + epoch).permutation(n)

    def __iter__(self) -> Iterator[list[Any]]:
        if self.streaming:
            yield from self._stream()
            return
        per_epoch = self.samples_per_epoch
        if per_epoch == 0:
            return
        order = self.epoch_order(self._epoch)
        while self._offset < per_epoch:
            indices = order[self._offset : self._offset + self.batch_size].tolist()
            batch = self._fetch(indices)
            # State is updated before the yield, so it is exact even if the consumer stops here.
            self._offset += len(indices)
            self._consumed += len(indices)
            if self._offset >= per_epoch:
                self._epoch += 1
                self._offset = 0
                yield batch
                return
            yield batch

    def _stream(self) -> Iterator[list[Any]]:
        stream = iter(self.dataset)  # type: ignore[call-overload]
        skipped = 0
        while skipped < self._offset and next(stream, _END) is not _END:
            skipped += 1
        batch: list[Any] = []
        for sample in stream:
            batch.append(sample)
            if len(batch) == self.batch_size:
                self._offset += len(batch)
                self._consumed += len(batch)
                yield batch
                batch = []
        if batch and not self.drop_last:
            self._offset += len(batch)
            self._consumed += len(batch)
            yield batch
        self._epoch += 1
        self._offset = 0

    def _fetch(self, indices: list[int]) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return list(getitems(indices))
        return [self.dataset[i] for i in indices]

    def get_state(self) -> dict[str, Any]:
        """Progress to store in a checkpoint.

        Returns:
            ``consumed_train_samples`` (total over all epochs), ``epoch`` (the current one) and
            ``seed``.
        """
        return {"consumed_train_samples": self._consumed, "epoch": self._epoch, "seed": self.seed}

    def resume_from_checkpoint(self, consumed_train_samples: int) -> None:
        """Skip what a previous run already trained on.

        The next iteration yields exactly the samples not seen yet: the rest of the same epoch,
        in the same order (same ``seed``, ``batch_size`` and dataset assumed).

        Raises:
            ValueError: If ``consumed_train_samples`` is negative.
        """
        if consumed_train_samples < 0:
            raise ValueError(f"consumed_train_samples must be >= 0, got {consumed_train_samples}")
        self._consumed = consumed_train_samples
        if self.streaming:
            # The stream's epoch length is unknown: skip that many samples of the next pass.
            self._epoch, self._offset = 0, consumed_train_samples
            return
        per_epoch = self.samples_per_epoch
        if per_epoch == 0:
            self._epoch, self._offset = 0, 0
            return
        self._epoch, self._offset = divmod(consumed_train_samples, per_epoch)
