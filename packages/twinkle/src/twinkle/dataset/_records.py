"""How trajectories and encoded rows are stored in an Arrow table, and read back.

Arrow needs one type per column, but ``user_data`` and ``tools`` are free-form (lists of
tuples of mixed types, JSON schemas...), so they are stored as JSON text and decoded on read.
Images (PIL, bytes) are stored as data URIs; paths stay paths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from twinkle.data_format import InputFeature, Trajectory

# Trajectory fields stored as JSON text.
JSON_FIELDS = ("user_data", "tools")
# Columns of an encoded row besides the features.
PASSTHROUGH_COLUMNS = ("user_data",)


def is_trajectory(value: Any) -> bool:
    """A ``Trajectory`` or a dict with ``messages``."""
    return isinstance(value, Trajectory) or (isinstance(value, Mapping) and "messages" in value)


def trajectory_record(value: Trajectory | Mapping[str, Any], live: bool = False) -> dict[str, Any]:
    """A trajectory as an Arrow-storable dict: ``messages`` (every message's content a list of
    parts if any is, so one row has one content type), ``extra`` when non-empty, and the
    :data:`JSON_FIELDS` as JSON text when non-empty.

    With ``live`` the record is for use in memory only: images stay as given (PIL, bytes) and
    the JSON fields stay Python values.

    Raises:
        ValueError: An invalid trajectory (the pydantic message).
    """
    trajectory = Trajectory.coerce(dict(value) if not isinstance(value, Trajectory) else value)
    dumped = trajectory.model_dump(mode="python" if live else "json", exclude_none=True)
    messages = dumped["messages"]
    if any(isinstance(m["content"], list) for m in messages):
        for message in messages:
            if isinstance(message["content"], str):
                message["content"] = [{"type": "text", "text": message["content"]}]
    for message in messages:
        if not message.get("tool_calls"):
            message.pop("tool_calls", None)
    record: dict[str, Any] = {"messages": messages}
    if dumped.get("extra"):
        record["extra"] = dumped["extra"]
    for field in JSON_FIELDS:
        if dumped.get(field):
            record[field] = dumped[field] if live else json.dumps(dumped[field], ensure_ascii=False)
    return record


def storable(row: Any, live: bool = False) -> dict[str, Any]:
    """A preprocessor's output row as an Arrow-storable dict: a trajectory becomes its record;
    a dict keeps its keys, each trajectory value (``{'positive': ..., 'negative': ...}``)
    becoming its record (``live``: see :func:`trajectory_record`).

    Raises:
        TypeError: Neither a trajectory nor a dict.
    """
    if is_trajectory(row):
        return trajectory_record(row, live)
    if not isinstance(row, Mapping):
        raise TypeError(
            f"a preprocessor must return a Trajectory, a dict or None, got {type(row).__name__}"
        )
    return {key: trajectory_record(v, live) if is_trajectory(v) else v for key, v in row.items()}


def decode_json_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with its :data:`JSON_FIELDS` (stored as text) decoded."""
    out = dict(record)
    for field in JSON_FIELDS:
        if isinstance(out.get(field), str):
            out[field] = json.loads(out[field])
        elif field in out and out[field] is None:
            del out[field]
    return out


def read_row(row: Mapping[str, Any], paired: tuple[str, ...] | None, encoded: bool) -> Any:
    """A stored row as callers see it: an ``InputFeature`` (or, for paired rows, a dict of
    them) once encoded, otherwise the row with its trajectory fields decoded."""
    row = decode_json_fields(row)
    if not encoded:
        for key, value in row.items():
            if isinstance(value, Mapping) and "messages" in value:
                row[key] = decode_json_fields(value)
        return row
    if not paired:
        return InputFeature(row)
    out = {key: value for key, value in row.items() if key not in paired}
    out.update({key: InputFeature(row[key]) for key in paired})
    return out
