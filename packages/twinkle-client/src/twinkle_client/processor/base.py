"""``InputProcessor``: pads a list of ``InputFeature``s into one batch of tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from twinkle_client.data_format import IGNORE_INDEX, InputFeature

PADDING_SIDES = ("left", "right")
RETURN_TENSORS = ("pt", "np")

# Keys built here, and per-sample metadata that is not a model input.
_BUILT_KEYS = ("input_ids", "labels", "attention_mask", "position_ids")
#: Fields of a sample that are not token grids: a sampled ``new_input_feature`` carries its
#: conversation and the row's data beside the ids (rewards read them); they never become tensors.
CONVERSATION_KEYS = ("messages", "user_data", "tools", "extra", "images", "videos")
_SKIPPED_KEYS = ("length", *CONVERSATION_KEYS)
#: Image inputs: per-sample arrays joined along their first axis (patches, images) in sample
#: order, as Qwen-VL models take them; a sample without images adds nothing.
IMAGE_KEYS = ("pixel_values", "image_grid_thw")


class InputProcessor:
    """Collates samples of different lengths into ``[B, T]`` arrays.

    Output keys: ``input_ids`` (padded with ``pad_token_id``), ``attention_mask`` (1 on real
    tokens), ``labels`` (``-100`` on padding, and everywhere for a sample without labels) and
    ``position_ids`` (0, 1, ... over the real tokens, 0 on padding). Other per-sample numeric
    keys ride along: arrays of length ``T`` are padded with 0 (e.g. ``advantages``, ``logprobs``),
    scalars are stacked into ``[B]``. Non-numeric values (strings, dicts) are left out.
    Image inputs (``pixel_values`` ``[patches, dim]`` and ``image_grid_thw`` ``[images, 3]``)
    are concatenated over the samples that have them, in order; samples without images (or with
    ``None`` there) may share the batch.

    Args:
        padding_side: ``'right'`` for training, ``'left'`` for generation.
        pad_token_id: Id used for padding; ``None`` means 0 (the padded positions are masked).
        return_tensors: ``'pt'`` for torch tensors, ``'np'`` for numpy arrays (no torch import).

    Raises:
        ValueError: On an unknown ``padding_side`` or ``return_tensors``.
    """

    def __init__(
        self,
        padding_side: str = "right",
        pad_token_id: int | None = None,
        return_tensors: str = "pt",
    ) -> None:
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")
        if return_tensors not in RETURN_TENSORS:
            raise ValueError(
                f"return_tensors must be one of {RETURN_TENSORS}, got {return_tensors!r}"
            )
        self.padding_side = padding_side
        self.pad_token_id = pad_token_id
        self.return_tensors = return_tensors

    def __repr__(self) -> str:
        return (
            f"InputProcessor(padding_side={self.padding_side!r}, "
            f"pad_token_id={self.pad_token_id!r}, return_tensors={self.return_tensors!r})"
        )

    def __call__(self, features: Sequence[InputFeature | Mapping[str, Any]]) -> dict[str, Any]:
        """Pad and stack ``features`` into a batch.

        Raises:
            ValueError: On an empty batch, a key present in only some samples, or a per-token
                array whose length differs from its sample's ``input_ids``.
        """
        if not features:
            raise ValueError("cannot collate an empty batch")
        samples = [InputFeature.coerce(f) for f in features]
        lengths = np.array([s["input_ids"].shape[0] for s in samples])
        width = int(lengths.max())
        pad_id = 0 if self.pad_token_id is None else self.pad_token_id
        mask_BT = self._pad([np.ones(n, np.int64) for n in lengths], width, 0)
        batch = {
            "input_ids": self._pad([s["input_ids"] for s in samples], width, pad_id),
            "attention_mask": mask_BT,
            "labels": self._pad([s["labels"] for s in samples], width, IGNORE_INDEX),
            "position_ids": np.maximum(np.cumsum(mask_BT, axis=1) - 1, 0) * mask_BT,
        }
        batch.update(self._extras(samples, lengths, width))
        batch.update(_image_inputs(samples))
        return self._convert(batch)

    def _pad(self, rows: list[np.ndarray], width: int, value: Any) -> np.ndarray:
        dtype = np.result_type(*[r.dtype for r in rows])
        out = np.full((len(rows), width), value, dtype=dtype)
        for i, row in enumerate(rows):
            if self.padding_side == "right":
                out[i, : row.shape[0]] = row
            else:
                out[i, width - row.shape[0] :] = row
        return out

    def _extras(self, samples: list[InputFeature], lengths: np.ndarray, width: int) -> dict:
        keys = dict.fromkeys(k for s in samples for k in s)
        extras = {}
        for key in keys:
            if key in _BUILT_KEYS or key in _SKIPPED_KEYS or key in IMAGE_KEYS:
                continue
            if any(key not in s for s in samples):
                raise ValueError(f"key {key!r} is present in only some samples of the batch")
            values = [np.asarray(s[key]) for s in samples]
            if any(v.dtype.kind not in "biuf" for v in values):
                continue
            if all(v.ndim == 0 for v in values):
                extras[key] = _narrow(np.stack(values))
                continue
            for value, n in zip(values, lengths):
                if value.shape != (n,):
                    raise ValueError(
                        f"{key!r} has shape {value.shape}, expected ({n},) like its input_ids"
                    )
            extras[key] = _narrow(self._pad(values, width, 0))
        return extras

    def _convert(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        if self.return_tensors == "np":
            return batch
        import torch

        return {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in batch.items()}


def _image_inputs(samples: list[InputFeature]) -> dict[str, np.ndarray]:
    """``pixel_values`` and ``image_grid_thw`` of the samples that carry images, concatenated."""
    with_images = [s for s in samples if s.get("image_grid_thw") is not None]
    if not with_images:
        return {}
    grids, pixels = [], []
    for sample in with_images:
        grid = np.asarray(sample["image_grid_thw"], dtype=np.int64).reshape(-1, 3)
        values = np.asarray(sample.get("pixel_values"), dtype=np.float32)
        if values.ndim != 2 or values.shape[0] != int(grid.prod(-1).sum()):
            raise ValueError(
                f"pixel_values has shape {values.shape}, expected {int(grid.prod(-1).sum())} "
                "patch rows for its image_grid_thw"
            )
        grids.append(grid)
        pixels.append(values)
    return {"pixel_values": np.concatenate(pixels), "image_grid_thw": np.concatenate(grids)}


def _narrow(array: np.ndarray) -> np.ndarray:
    """float64 -> float32: models compute in float32 or lower, and float64 would upcast losses."""
    return array.astype(np.float32) if array.dtype == np.float64 else array
