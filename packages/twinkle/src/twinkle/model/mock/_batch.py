"""Turning rows of token ids into the flat next-token positions the mock model computes on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from twinkle.errors import InvalidArgumentError


@dataclass
class Batch:
    """Flattened next-token positions; position ``n`` belongs to row ``row_N[n]``.

    Attributes:
        ids_N: input token at each position.
        targets_N: the label it predicts (HF shift: ``labels[t + 1]``), 0 where ignored.
        valid_N: whether the label is a target (not -100).
        row_N: the row of each position.
        lengths: each row's length, to rebuild per-row arrays.
    """

    ids_N: np.ndarray
    targets_N: np.ndarray
    valid_N: np.ndarray
    row_N: np.ndarray
    lengths: list[int]


def flatten(rows: list[dict], vocab_size: int) -> Batch:
    """Flatten rows (``input_ids``, optional ``labels`` defaulting to ``input_ids``).

    Raises:
        ValueError: for mismatched shapes or out-of-vocabulary ids.
    """
    ids, targets, row_index, lengths = [], [], [], []
    for i, row in enumerate(rows):
        if "input_ids" not in row:
            # A trajectory (messages): the mock backend has no template to encode it with.
            raise InvalidArgumentError(
                f"row {i} has no input_ids: the mock backend trains on encoded rows only "
                "(encode with a Template on the client, or serve backend: transformers)"
            )
        row_ids = np.asarray(row["input_ids"], dtype=np.int64).reshape(-1)
        labels = np.asarray(row.get("labels", row_ids), dtype=np.int64).reshape(-1)
        if labels.shape != row_ids.shape:
            raise InvalidArgumentError(
                f"row {i}: labels {labels.shape} != input_ids {row_ids.shape}"
            )
        if row_ids.size and (row_ids.min() < 0 or row_ids.max() >= vocab_size):
            raise InvalidArgumentError(f"row {i}: token ids must lie in [0, {vocab_size})")
        ids.append(row_ids[:-1])
        targets.append(labels[1:])
        row_index.append(np.full(max(row_ids.size - 1, 0), i, dtype=np.int64))
        lengths.append(row_ids.size)
    targets_N = np.concatenate(targets)
    valid_N = targets_N != -100
    return Batch(
        np.concatenate(ids),
        np.where(valid_N, targets_N, 0),
        valid_N,
        np.concatenate(row_index),
        lengths,
    )


def per_row(batch: Batch, values_N: np.ndarray) -> list[np.ndarray]:
    """Split per-position values back into rows aligned with ``labels`` (0 at position 0)."""
    out = []
    for i, length in enumerate(batch.lengths):
        row = np.zeros(length)
        row[1:] = values_N[batch.row_N == i]
        out.append(row)
    return out
