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


def input_feature_to_datum(feature: Mapping[str, Any]) -> Any:
    """A Twinkle ``InputFeature`` (``input_ids``, ``labels``) as a ``tinker.types.Datum``.

    Args:
        feature: ``input_ids`` and ``labels`` of equal length (at least 2 tokens); a feature
            without ``labels`` trains on every token.

    Returns:
        A ``cross_entropy`` datum: ``model_input`` = ``input_ids[:-1]``, ``target_tokens`` =
        ``input_ids[1:]``, ``weights`` = 1.0 where ``labels[1:]`` is not -100.

    Raises:
        ValueError: On fewer than 2 tokens or ``labels`` of another length.
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
        model_input=types.ModelInput.from_ints(ids_N[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(ids_N[1:].copy()),
            "weights": types.TensorData.from_numpy(weights_T),
        },
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
