"""Python values -> JSON for the wire: numpy arrays, features, trajectories, sample results."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np


def jsonable(value: Any) -> Any:
    """Arrays and tensors -> lists, numpy scalars -> Python, pydantic models and dataclasses ->
    dicts, recursively."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "model_dump"):
        dumped = value.model_dump(mode="json")
        return inline_images(dumped) if isinstance(dumped, dict) else dumped
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        if "messages" in value:
            value = inline_images(value)
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, range)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # a torch tensor, without importing torch
        return value.tolist()
    return value


def inline_images(trajectory: Mapping[str, Any]) -> dict[str, Any]:
    """``trajectory`` with every image part's image as a data URI: a local path is read here
    (the server never reads a client's path), bytes and PIL images are encoded. The images
    travel inside the request; the server validates them (size, decoding, pixel count).

    Raises:
        ValueError: An image part whose image cannot be read (no such file, bad base64, a URL).
    """
    from twinkle_client.data_format._content import ImagePart, image_data_uri

    messages = trajectory.get("messages")
    if not isinstance(messages, list):
        return dict(trajectory)
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "image":
                    image = ImagePart.model_validate(dict(part))
                    value = image.image
                    if not (isinstance(value, str) and value.startswith("data:")):
                        value = image_data_uri(image.image_bytes())
                    part = {"type": "image", "image": value}
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return {**trajectory, "messages": out}


def training_inputs(inputs: Any) -> list[dict[str, Any]]:
    """What ``forward_backward(inputs=...)`` takes, as the wire's list of feature/trajectory dicts.

    Accepts one sample or a list of them: ``InputFeature``s or dicts with ``input_ids``,
    trajectories (pydantic or ``{'messages': [...]}``), and single-sequence sample results
    (local or client ``SampleResult``), which become their training features.

    Raises:
        ValueError: For a collated ``[B, T]`` batch, or a sample result with several sequences.
        TypeError: For anything else.
    """
    if _is_one_sample(inputs):
        inputs = [inputs]
    return [_sample(item, i) for i, item in enumerate(inputs)]


def _is_one_sample(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        or hasattr(value, "messages")
        or hasattr(value, "sequences")
        and not isinstance(value, list)
    )


def _sample(item: Any, index: int) -> dict[str, Any]:
    if hasattr(item, "messages") and hasattr(item, "model_dump"):
        return inline_images(item.model_dump(mode="json"))
    if hasattr(item, "sequences") and hasattr(item, "features"):
        features = item.features()
        if len(features) != 1:
            raise ValueError(
                f"inputs[{index}] holds {len(features)} sequences, so it is not one training sample: "
                "train on SampleResponse.features() (one row per sequence) instead"
            )
        item = features[0]
    if isinstance(item, Mapping):
        if "input_ids" in item and np.ndim(item["input_ids"]) != 1:
            raise ValueError(
                f"inputs[{index}].input_ids has shape {np.shape(item['input_ids'])}: send a list of "
                "samples (padding and collation run on the server)"
            )
        if "input_ids" not in item and "messages" not in item:
            raise ValueError(f"inputs[{index}] has neither input_ids nor messages")
        item = dict(item)
        if item.get("pixel_values") is not None:
            item.pop("images", None)  # the image files of encoded pixels: the pixels go
        return jsonable(item)
    raise TypeError(
        f"inputs[{index}] is a {type(item).__name__}: expected an InputFeature/dict, a Trajectory "
        "or a SampleResult"
    )
