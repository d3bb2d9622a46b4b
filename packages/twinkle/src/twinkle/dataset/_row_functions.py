"""The functions ``Dataset.map`` and ``Dataset.encode`` hand to HF ``datasets.map``, and the
row-level steps the lazy and streaming datasets share with them.

They are picklable classes rather than closures so ``num_proc`` workers can run them, and they
attach the row index to every error so a bad row in a large file is easy to find.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from twinkle.data_format import Trajectory
from twinkle.dataset._records import PASSTHROUGH_COLUMNS, decode_json_fields, storable
from twinkle.preprocessor import MissingFieldError
from twinkle.preprocessor._rows import run_filter, run_preprocessor
from twinkle.template import Template

_ENCODED_COLUMNS = ("input_ids", "labels", "length")
# Written (None on rows without images) whenever the template's model reads images, so every
# batch of one encode has the same columns.
_IMAGE_COLUMNS = ("pixel_values", "image_grid_thw")


def preprocess_row(
    fn: Callable[[Any], Any], index: int, row: Mapping[str, Any], live: bool = False
) -> list[dict]:
    """``fn`` applied to row ``index``: the storable rows it makes (none when it drops it;
    ``live``: rows kept in memory, see ``trajectory_record``).

    Raises:
        ValueError: A missing field or a bad result, naming the row.
    """
    try:
        return [storable(out, live) for out in run_preprocessor(fn, row)]
    except MissingFieldError as exc:
        raise ValueError(f"row {index}: {exc}") from exc
    except KeyError as exc:
        raise ValueError(f"row {index}: missing field {exc.args[0]!r}") from exc
    except (TypeError, ValidationError) as exc:
        raise ValueError(f"row {index}: {exc}") from exc


def keeps(fn: Callable[[Any], Any], index: int, row: Mapping[str, Any]) -> bool:
    """Whether filter ``fn`` keeps row ``index``."""
    try:
        return run_filter(fn, row)
    except KeyError as exc:
        raise ValueError(f"row {index}: missing field {exc.args[0]!r}") from exc


class PreprocessBatch:
    """Batched ``datasets.map`` function: runs a row preprocessor, drops ``None`` results."""

    def __init__(self, fn: Callable[[Mapping[str, Any]], Any]) -> None:
        self.fn = fn

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        outputs = []
        for index, values in zip(indices, zip(*batch.values())):
            outputs += preprocess_row(self.fn, index, dict(zip(batch, values)))
        keys = list(dict.fromkeys(k for out in outputs for k in out)) or ["messages"]
        return {key: [out.get(key) for out in outputs] for key in keys}


def paired_columns(row: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The columns of ``row`` holding trajectories when it has no ``messages`` of its own
    (``('positive', 'negative')`` for preference data), else ``None``."""
    if "messages" in row:
        return None
    keys = tuple(k for k, v in row.items() if isinstance(v, Mapping) and "messages" in v)
    return keys or None


def encode_records(
    template: Template,
    records: Sequence[Mapping[str, Any]],
    indices: Sequence[int],
    add_generation_prompt: bool = False,
) -> list[dict[str, Any] | None]:
    """Tokenise stored rows: each becomes its feature (or, for paired rows, a dict of features)
    plus its ``user_data``; ``None`` where truncation ``'delete'`` drops a trajectory.

    Raises:
        ValueError: A malformed row (naming it) or an over-long one under ``'raise'``.
    """
    if not records:
        return []
    paired = paired_columns(records[0])
    keys = paired or (None,)
    encoded: dict[Any, list] = {}
    for key in keys:
        trajectories = [
            _trajectory(index, record if key is None else record.get(key))
            for index, record in zip(indices, records)
        ]
        try:
            encoded[key] = template.batch_encode(trajectories, add_generation_prompt)
        except ValueError as exc:
            if len(indices) == 1:
                raise ValueError(f"row {indices[0]}: {exc}") from exc
            raise
    out: list[dict[str, Any] | None] = []
    for position, record in enumerate(records):
        features = {key: encoded[key][position] for key in keys}
        if any(f is None for f in features.values()):
            out.append(None)
            continue
        row = dict(features[None]) if paired is None else dict(features)
        for column in PASSTHROUGH_COLUMNS:
            if record.get(column) is not None:
                row[column] = record[column]
        out.append(row)
    return out


class EncodeBatch:
    """Batched ``datasets.map`` function: stored trajectories -> token ids and labels."""

    def __init__(self, template: Template, add_generation_prompt: bool = False) -> None:
        self.template = template
        self.add_generation_prompt = add_generation_prompt

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        records = [dict(zip(batch, values)) for values in zip(*batch.values())]
        rows = [
            r
            for r in encode_records(self.template, records, indices, self.add_generation_prompt)
            if r
        ]
        columns = _ENCODED_COLUMNS
        if self.template.image_processor is not None:
            columns += _IMAGE_COLUMNS
        paired = paired_columns(records[0]) if records else None
        out: dict[str, list] = {}
        if paired:
            for key in paired:
                out[key] = [{c: _column_value(r[key].get(c)) for c in columns} for r in rows]
        else:
            out = {c: [_column_value(r.get(c)) for r in rows] for c in columns}
        for column in PASSTHROUGH_COLUMNS:
            if column in batch:
                out[column] = [r.get(column) for r in rows]
        return out


def _column_value(value: Any) -> Any:
    # Arrow stores nested lists; a 2-D numpy array would need its own extension type.
    return value.tolist() if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 1 else value


def _trajectory(index: int, record: Any) -> Trajectory:
    if not isinstance(record, Mapping) or record.get("messages") is None:
        raise ValueError(f"row {index}: missing field 'messages'")
    for position, message in enumerate(record["messages"]):
        for field in ("role", "content"):
            if message.get(field) is None:
                raise ValueError(f"row {index}: missing field {field!r} in messages[{position}]")
    fields = decode_json_fields(record)
    try:
        return Trajectory(
            messages=fields["messages"],
            tools=fields.get("tools") or [],
            user_data=fields.get("user_data") or [],
            extra=fields.get("extra") or {},
        )
    except ValidationError as exc:
        raise ValueError(f"row {index}: invalid trajectory: {exc}") from exc


def encode_fingerprint(previous: str, template: Template, add_generation_prompt: bool) -> str:
    """Cache key for an encoding: the data, the template settings and the exact vocabulary."""
    vocab = template.tokenizer.get_vocab()
    digest = hashlib.sha256()
    parts = (
        previous,
        repr(template),
        str(add_generation_prompt),
        json.dumps(sorted(vocab.items())),
    )
    for part in parts:
        digest.update(part.encode())
    return digest.hexdigest()[:32]
