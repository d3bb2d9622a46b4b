"""Between Twinkle's ``InputFeature`` and the Tinker SDK's ``Datum``.

Twinkle features are Hugging Face aligned: ``labels[t]`` is the label of ``input_ids[t]`` (-100 =
not trained) and the model shifts them. A Tinker datum is already shifted: the model reads
``model_input = tokens[:-1]`` and is trained on ``target_tokens[t] = tokens[t + 1]`` with
``weights[t] = 1`` where that target is trained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from twinkle.data_format import IGNORE_INDEX
from twinkle.errors import InvalidArgumentError
from twinkle_client.data_format import ImagePart


def input_feature_to_datum(feature: Mapping[str, Any]) -> Any:
    """A Twinkle ``InputFeature`` (``input_ids``, ``labels``) as a ``tinker.types.Datum``.

    Args:
        feature: ``input_ids`` and ``labels`` of equal length (at least 2 tokens); a feature
            without ``labels`` trains on every token. An image-text feature (``pixel_values``,
            ``image_grid_thw``) also needs its ``images`` (the encoded files, in order, as a
            ``LazyDataset`` keeps them): each run of image tokens becomes an ``ImageChunk``.

    Returns:
        A ``cross_entropy`` datum: ``model_input`` = ``input_ids[:-1]``, ``target_tokens`` =
        ``input_ids[1:]``, ``weights`` = 1.0 where ``labels[1:]`` is not -100.

    Raises:
        ValueError: On fewer than 2 tokens, ``labels`` of another length, or an image-text
            feature without its images.
    """
    from tinker import types

    ids_N = np.asarray(feature["input_ids"], dtype=np.int64).reshape(-1)
    labels = feature.get("labels")
    labels_N = ids_N if labels is None else np.asarray(labels, dtype=np.int64).reshape(-1)
    if ids_N.shape[0] < 2:
        raise InvalidArgumentError("a feature needs at least 2 tokens to make a datum")
    if labels_N.shape != ids_N.shape:
        raise InvalidArgumentError(
            f"labels has {labels_N.shape[0]} entries for {ids_N.shape[0]} input_ids"
        )
    weights_T = (labels_N[1:] != IGNORE_INDEX).astype(np.float32)
    return types.Datum(
        model_input=_model_input(types, ids_N[:-1], feature),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(ids_N[1:].copy()),
            "weights": types.TensorData.from_numpy(weights_T),
        },
    )


# Qwen-VL models merge 2 x 2 patches into one image token.
_MERGE_SQUARED = 4


def _model_input(types: Any, ids_T: np.ndarray, feature: Mapping[str, Any]) -> Any:
    """``ids_T`` as a ``ModelInput``: text chunks, and an ``ImageChunk`` for each image's run of
    ``<|image_pad|>`` tokens (the server expands it back to that run)."""
    grid = feature.get("image_grid_thw")
    if grid is None:
        return types.ModelInput.from_ints(ids_T.tolist())
    tokens_I = np.asarray(grid, dtype=np.int64).reshape(-1, 3).prod(-1) // _MERGE_SQUARED
    images = list(feature.get("images") or [])
    if len(images) != len(tokens_I):
        raise InvalidArgumentError(
            f"this feature has {len(tokens_I)} image(s) encoded as pixel_values but "
            f"{len(images)} image file(s) under 'images': a Tinker datum carries images as "
            "files; encode with a LazyDataset (it keeps them) or pass the trajectory's images"
        )
    starts = _image_runs(ids_T, tokens_I)
    chunks, at = [], 0
    for start, count, image in zip(starts, tokens_I.tolist(), images):
        if start > at:
            chunks.append(types.EncodedTextChunk(tokens=ids_T[at:start].tolist()))
        data = ImagePart(image=image).image_bytes()
        chunks.append(types.ImageChunk(data=data, format="png", expected_tokens=count))
        at = start + count
    if at < len(ids_T):
        chunks.append(types.EncodedTextChunk(tokens=ids_T[at:].tolist()))
    return types.ModelInput(chunks=chunks)


def _image_runs(ids_T: np.ndarray, tokens_I: np.ndarray) -> list[int]:
    """Where each image's token run starts: the image token is the one id whose positions are
    exactly runs of the images' token counts, in order."""
    total = int(tokens_I.sum())
    values, counts = np.unique(ids_T, return_counts=True)
    for candidate in values[counts == total]:
        positions = np.flatnonzero(ids_T == candidate)
        starts, i = [], 0
        for count in tokens_I.tolist():
            run = positions[i : i + count]
            if len(run) != count or run[-1] - run[0] != count - 1:
                break
            starts.append(int(run[0]))
            i += count
        else:
            return starts
    raise InvalidArgumentError(
        f"input_ids hold no runs of image tokens of lengths {tokens_I.tolist()} (the images' "
        "token counts from image_grid_thw)"
    )


def datum_to_input_feature(datum: Any) -> dict[str, np.ndarray]:
    """The inverse of :func:`input_feature_to_datum`: ``input_ids`` and HF-aligned ``labels``.

    ``labels[0]`` is -100 (no token predicts the first one); ``labels[t + 1]`` is
    ``target_tokens[t]`` where ``weights[t] > 0``, else -100.
    """
    tokens_T = np.asarray(datum.model_input.to_ints(), dtype=np.int64)
    targets_T = np.asarray(
        datum.loss_fn_inputs["target_tokens"].to_numpy(), dtype=np.int64
    ).reshape(-1)
    weights = datum.loss_fn_inputs.get("weights")
    weights_T = (
        np.ones_like(targets_T, dtype=np.float32)
        if weights is None
        else weights.to_numpy().reshape(-1)
    )
    if targets_T.shape != tokens_T.shape or weights_T.shape != tokens_T.shape:
        raise InvalidArgumentError(
            "target_tokens and weights must have one entry per model_input token"
        )
    input_ids = np.concatenate([tokens_T[:1], targets_T])
    labels = np.concatenate(
        [[IGNORE_INDEX], np.where(weights_T > 0, targets_T, IGNORE_INDEX)]
    ).astype(np.int64)
    return {"input_ids": input_ids, "labels": labels}


__all__ = ["datum_to_input_feature", "input_feature_to_datum"]
