"""Packing: several encoded samples joined into one row of at most ``max_length`` tokens.

Numpy only, shared by the local (``twinkle.dataset``) and remote (``twinkle_client.dataset``)
packing datasets, so both pack the same rows the same way.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from twinkle_client.data_format import InputFeature

# Per-sample image arrays, joined along their first axis.
_IMAGE_KEYS = ("pixel_values", "image_grid_thw")


def pack_lengths(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Group sample indices into bins of total length at most ``max_length``.

    Best-fit decreasing: longest samples first, each into the fullest bin it still fits, so
    few bins are needed. Deterministic: equal lengths keep their index order, and each bin
    lists its indices in increasing order; bins are ordered by their first index.

    Raises:
        ValueError: A non-positive ``max_length``, or a sample longer than it.
    """
    if max_length <= 0:
        raise ValueError(f"max_length must be positive, got {max_length}")
    too_long = [i for i, n in enumerate(lengths) if n > max_length]
    if too_long:
        raise ValueError(
            f"sample {too_long[0]} has {lengths[too_long[0]]} tokens, more than the packing "
            f"max_length={max_length}; set max_length (or truncation) in set_template"
        )
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, bin number), sorted
    for index in order:
        need = int(lengths[index])
        slot = bisect.bisect_left(free, (need, -1))
        if slot < len(free):
            room, number = free.pop(slot)
        else:
            room, number = max_length, len(bins)
            bins.append([])
        bins[number].append(index)
        bisect.insort(free, (room - need, number))
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def pack_features(features: Sequence[Mapping[str, Any]]) -> InputFeature:
    """Join ``features`` into one sample.

    ``input_ids``, ``labels`` and every other per-token array are concatenated; ``position_ids``
    restart at 0 for each sample, so a model that reads them sees where each sample begins;
    ``pixel_values`` and ``image_grid_thw`` are concatenated in sample order; ``length`` is the
    total. Other per-sample values (``user_data``, scalars) do not describe a packed row and
    are left out.

    Raises:
        ValueError: No features.
    """
    if not features:
        raise ValueError("cannot pack zero samples")
    samples = [InputFeature.coerce(f) for f in features]
    lengths = [int(s["input_ids"].shape[0]) for s in samples]
    packed: dict[str, Any] = {
        "input_ids": np.concatenate([s["input_ids"] for s in samples]),
        "labels": np.concatenate([s["labels"] for s in samples]),
        "position_ids": np.concatenate([np.arange(n, dtype=np.int64) for n in lengths]),
    }
    for key in samples[0]:
        if key in packed or key in _IMAGE_KEYS or key == "length":
            continue
        values = [s.get(key) for s in samples]
        if all(_per_token(v, n) for v, n in zip(values, lengths)):
            packed[key] = np.concatenate([np.asarray(v) for v in values])
    for key in _IMAGE_KEYS:
        arrays = [np.asarray(s[key]) for s in samples if s.get(key) is not None]
        if arrays:
            packed[key] = np.concatenate(arrays)
    packed["length"] = sum(lengths)
    return InputFeature(packed)


def _per_token(value: Any, length: int) -> bool:
    return isinstance(value, np.ndarray) and value.ndim == 1 and value.shape[0] == length


def pack_stream(
    features: Iterator[Mapping[str, Any]], max_length: int, window: int
) -> Iterator[InputFeature]:
    """Pack a stream of samples ``window`` at a time.

    Each window is packed with :func:`pack_lengths`; its least-filled bin is carried into the
    next window (so it can still fill up) and the others are yielded. The last window yields
    everything.

    Raises:
        ValueError: A non-positive ``window`` or ``max_length``, or a sample longer than it.
    """
    if window <= 0:
        raise ValueError(f"packing_interval must be positive, got {window}")
    carried: list[Mapping[str, Any]] = []
    buffer: list[Mapping[str, Any]] = []
    for feature in features:
        buffer.append(feature)
        if len(buffer) < window:
            continue
        samples = carried + buffer
        bins = pack_lengths([_length(s) for s in samples], max_length)
        totals = [sum(_length(samples[i]) for i in b) for b in bins]
        keep = totals.index(min(totals))
        for number, group in enumerate(bins):
            if number != keep:
                yield pack_features([samples[i] for i in group])
        carried, buffer = [samples[i] for i in bins[keep]], []
    samples = carried + buffer
    if samples:
        for group in pack_lengths([_length(s) for s in samples], max_length):
            yield pack_features([samples[i] for i in group])


def _length(feature: Mapping[str, Any]) -> int:
    return int(np.asarray(feature["input_ids"]).shape[0])


__all__ = ["pack_features", "pack_lengths", "pack_stream"]


class PackedRows:
    """Reads a dataset as packed rows once it is encoded: mixed in before the local or remote
    ``Dataset``, whose ``__getitems__`` returns the samples. The class defines ``pack_dataset``,
    which fills ``self._packs`` (sample indices per packed row)."""

    _packs: list[list[int]] | None
    _encoded: Any
    _CHUNK = 64  # packed rows read per request while iterating

    def pack_dataset(self) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._packed()) if self._encoded else super().__len__()  # type: ignore[misc]

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Packed row ``index`` once encoded, otherwise row ``index``."""
        if not self._encoded:
            return super().__getitem__(index)  # type: ignore[misc]
        if not isinstance(index, int):
            raise TypeError(f"Dataset indices must be int, got {type(index)!r}")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} packed rows")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Many (packed) rows, their samples read in one go."""
        if not self._encoded:
            return super().__getitems__(indices)  # type: ignore[misc]
        packs = self._packed()
        groups = [packs[i] for i in indices]
        samples = super().__getitems__([i for group in groups for i in group])  # type: ignore[misc]
        out: list[dict[str, Any]] = []
        start = 0
        for group in groups:
            out.append(pack_features(samples[start : start + len(group)]))
            start += len(group)
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self._encoded:
            yield from super().__iter__()  # type: ignore[misc]
            return
        for start in range(0, len(self), self._CHUNK):
            yield from self.__getitems__(range(start, min(start + self._CHUNK, len(self))))

    def _packed(self) -> list[list[int]]:
        if self._packs is None:
            self.pack_dataset()
        assert self._packs is not None
        return self._packs
