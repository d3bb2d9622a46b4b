"""The functions ``Dataset.map`` and ``Dataset.encode`` hand to HF ``datasets.map``.

They are picklable classes rather than closures so ``num_proc`` workers can run them, and they
attach the row index to every error so a bad row in a large file is easy to find.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from twinkle.data_format import Trajectory
from twinkle.preprocessor import MissingFieldError
from twinkle.template import Template

_ENCODED_COLUMNS = ("input_ids", "labels", "length")
# Written (None on rows without images) whenever the template's model reads images, so every
# batch of one encode has the same columns.
_IMAGE_COLUMNS = ("pixel_values", "image_grid_thw")


class PreprocessBatch:
    """Batched ``datasets.map`` function: runs a row preprocessor, drops ``None`` results."""

    def __init__(self, fn: Callable[[Mapping[str, Any]], Any]) -> None:
        self.fn = fn

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        outputs = []
        for index, values in zip(indices, zip(*batch.values())):
            row = dict(zip(batch, values))
            try:
                result = self.fn(row)
            except MissingFieldError as exc:
                raise ValueError(f"row {index}: {exc}") from exc
            except KeyError as exc:
                raise ValueError(f"row {index}: missing field {exc.args[0]!r}") from exc
            if result is None:
                continue
            if isinstance(result, Trajectory):
                result = result.model_dump(exclude_none=True)
            # An empty ``extra`` would become an Arrow struct without fields, which cannot be
            # stored; leaving it out is equivalent (Trajectory defaults it to {}).
            outputs.append({k: v for k, v in result.items() if not (k == "extra" and not v)})
        keys = list(dict.fromkeys(k for out in outputs for k in out)) or ["messages"]
        return {key: [out.get(key) for out in outputs] for key in keys}


class EncodeBatch:
    """Batched ``datasets.map`` function: trajectories -> token ids and labels."""

    def __init__(self, template: Template) -> None:
        self.template = template

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        trajectories = []
        for index, messages, extra in zip(
            indices, batch["messages"], batch.get("extra") or [None] * len(indices)
        ):
            trajectories.append(_trajectory(index, messages, extra))
        try:
            features = self.template.batch_encode(trajectories)
        except ValueError as exc:
            if len(indices) == 1:
                raise ValueError(f"row {indices[0]}: {exc}") from exc
            raise
        kept = [f for f in features if f is not None]
        columns = _ENCODED_COLUMNS
        if self.template.image_processor is not None:
            columns += _IMAGE_COLUMNS
        return {key: [_column_value(f.get(key)) for f in kept] for key in columns}


def _column_value(value: Any) -> Any:
    # Arrow stores nested lists; a 2-D numpy array would need its own extension type.
    return value.tolist() if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 1 else value


def _trajectory(index: int, messages: Any, extra: Any) -> Trajectory:
    if messages is None:
        raise ValueError(f"row {index}: missing field 'messages'")
    for position, message in enumerate(messages):
        for field in ("role", "content"):
            if message.get(field) is None:
                raise ValueError(f"row {index}: missing field {field!r} in messages[{position}]")
    try:
        return Trajectory(messages=messages, extra=extra or {})
    except ValidationError as exc:
        raise ValueError(f"row {index}: invalid trajectory: {exc}") from exc


def encode_fingerprint(previous: str, template: Template) -> str:
    """Cache key for an encoding: the data, the template settings and the exact vocabulary."""
    vocab = template.tokenizer.get_vocab()
    digest = hashlib.sha256()
    for part in (previous, repr(template), json.dumps(sorted(vocab.items()))):
        digest.update(part.encode())
    return digest.hexdigest()[:32]
