"""Tinker's JSON wire format, spoken by SDKs before the protobuf one (0.16.1, which ModelScope
Twinkle pins).

Those SDKs post ``ForwardBackwardRequest`` to ``/forward_backward`` and ``ForwardRequest`` to
``/forward`` as JSON, and read every future's result as JSON (they send no ``Accept:
application/x-protobuf``). Requests decode into the same :class:`~.wire.WireForwardBackward` the
protobuf path makes; protobuf results are turned into the SDK's JSON on the way out.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

import numpy as np

from twinkle.server.tinker.wire import PROTOBUF, WireDatum, WireForwardBackward
from twinkle.server.web.encoding import finite_json
from twinkle.server.web.errors import BadRequest

_DTYPES = {"int64": np.int64, "int32": np.int32, "float32": np.float32, "float64": np.float64}


def loads(raw: bytes) -> Any:
    """The JSON body of ``forward`` / ``forward_backward`` (decoded by :func:`decode_forward_backward`)."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise BadRequest("the request body is not valid JSON") from None


def decode_forward_backward(body: Any, forward_only: bool) -> WireForwardBackward:
    """A JSON ``ForwardBackwardRequest`` (or ``ForwardRequest``, ``forward_only``).

    Raises:
        BadRequest: Naming the field that is missing or malformed.
    """
    outer = "forward_input" if forward_only else "forward_backward_input"
    if not isinstance(body, dict) or not isinstance(body.get(outer), dict):
        raise BadRequest(f"{'forward' if forward_only else 'forward_backward'} needs {outer}")
    spec = body[outer]
    model_id, seq_id, loss_fn = body.get("model_id"), body.get("seq_id"), spec.get("loss_fn")
    if not isinstance(model_id, str) or not isinstance(loss_fn, str):
        raise BadRequest(f"{outer} needs loss_fn, and the request needs model_id")
    if seq_id is not None and (not isinstance(seq_id, int) or isinstance(seq_id, bool)):
        raise BadRequest(f"seq_id must be an integer, got {seq_id!r}")
    data = spec.get("data")
    if not isinstance(data, list):
        raise BadRequest(f"{outer}.data must be a list of datums")
    return WireForwardBackward(
        model_id,
        int(seq_id or 0),
        loss_fn,
        _loss_config(spec.get("loss_fn_config")),
        forward_only,
        [_datum(i, datum) for i, datum in enumerate(data)],
    )


def _loss_config(config: Any) -> dict[str, float | str]:
    """``loss_fn_config`` as the protobuf path reads it: numbers as floats (``true`` as 1.0)."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise BadRequest("loss_fn_config must be an object of numbers")
    out: dict[str, float | str] = {}
    for key, value in config.items():
        if isinstance(value, str):
            out[key] = value
        elif isinstance(value, (int, float)) and math.isfinite(float(value)):
            out[key] = float(value)
        else:
            raise BadRequest(f"loss_fn_config[{key!r}] must be a finite number")
    return out


def _datum(i: int, datum: Any) -> WireDatum:
    if not isinstance(datum, dict):
        raise BadRequest(f"data[{i}] must be a Datum object")
    chunks = (datum.get("model_input") or {}).get("chunks")
    if not isinstance(chunks, list):
        raise BadRequest(f"data[{i}].model_input needs a list of chunks")
    tokens: list[int] = []
    images: list[tuple[int, bytes, str, int | None]] = []
    for k, chunk in enumerate(chunks):
        where = f"data[{i}].model_input.chunks[{k}]"
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind == "image":
            images.append((len(tokens), *_image(chunk, where)))
        elif kind == "encoded_text" and isinstance(chunk.get("tokens"), list):
            values = chunk["tokens"]
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in values):
                raise BadRequest(f"{where}.tokens must be integers")
            tokens.extend(values)
        else:
            raise BadRequest(f"{where}: only encoded_text and image chunks are supported")
    inputs = datum.get("loss_fn_inputs")
    if not isinstance(inputs, dict):
        raise BadRequest(f"data[{i}].loss_fn_inputs must be an object of tensors")
    arrays = {name: _tensor(t, f"data[{i}].loss_fn_inputs[{name!r}]") for name, t in inputs.items()}
    shapes = {name: tuple(t.get("shape") or ()) for name, t in inputs.items()}
    return WireDatum(tokens, {n: a.reshape(-1) for n, a in arrays.items()}, shapes, images)


def _image(chunk: dict, where: str) -> tuple[bytes, str, int | None]:
    raw, expected = chunk.get("data"), chunk.get("expected_tokens")
    try:
        data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}.data: not base64 image bytes") from None
    if expected is not None and (not isinstance(expected, int) or isinstance(expected, bool)):
        raise BadRequest(f"{where}.expected_tokens must be an integer")
    return data, str(chunk.get("format")), expected


def _tensor(tensor: Any, where: str) -> np.ndarray:
    if not isinstance(tensor, dict) or not isinstance(tensor.get("data"), list):
        raise BadRequest(f"{where} must be a TensorData object with a data list")
    dtype = _DTYPES.get(tensor.get("dtype"))
    if dtype is None:
        raise BadRequest(f"{where}: unsupported dtype {tensor.get('dtype')!r}")
    try:
        return np.asarray(tensor["data"], dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        raise BadRequest(f"{where}.data is not a list of numbers") from None


def wants_protobuf(headers: Any) -> bool:
    """Whether the client reads protobuf results (SDKs since 0.27 ask for them)."""
    return PROTOBUF in (headers.get("accept") or "")


def result_as_json(kind: str, data: bytes) -> dict[str, Any]:
    """A stored protobuf result (``SampleResponse`` for a sample, else ``ForwardBackwardOutput``)
    as the JSON an SDK without protobuf support reads."""
    from tinker.proto import tinker_public_pb2 as pb

    if kind == "sample":
        msg = pb.SampleResponse()
        msg.ParseFromString(data)
        return _sample_json(pb, msg)
    msg = pb.ForwardBackwardOutput()
    msg.ParseFromString(data)
    return _forward_backward_json(msg)


def _floats(raw: bytes) -> list[float | None]:
    return [None if math.isnan(v) else v for v in np.frombuffer(raw, dtype=np.float32).tolist()]


def _sample_json(pb: Any, msg: Any) -> dict[str, Any]:
    sequences = [
        {
            "stop_reason": "length" if seq.stop_reason == pb.STOP_REASON_LENGTH else "stop",
            "tokens": np.frombuffer(seq.tokens, dtype=np.int32).tolist(),
            "logprobs": _floats(seq.logprobs) if seq.logprobs else None,
        }
        for seq in msg.sequences
    ]
    out: dict[str, Any] = {"type": "sample", "sequences": sequences}
    if msg.HasField("prompt_logprobs"):
        out["prompt_logprobs"] = _floats(msg.prompt_logprobs)
    return out


def _forward_backward_json(msg: Any) -> dict[str, Any]:
    """Per-datum float32 fields of the ``ArrayRecord`` :func:`.wire.encode_forward_backward_output`
    writes, as ``TensorData`` objects."""
    outputs: list[dict[str, Any]] = []
    for record in msg.loss_fn_outputs:
        rows: list[dict[str, Any]] = [{} for _ in range(record.num_datums)]
        for name, batched in record.fields.items():
            values = np.frombuffer(batched.data, dtype=np.float32)
            bounds = np.frombuffer(batched.offsets, dtype=np.int64) // 4
            for row, (lo, hi) in zip(rows, zip(bounds[:-1], bounds[1:])):
                part = values[lo:hi].tolist()
                row[name] = {"data": part, "dtype": "float32", "shape": [len(part)]}
        outputs.extend(rows)
    # NaN/inf log-probs or metrics (a diverged adapter) spelt as JSON strings, never a 500.
    return finite_json(
        {
            "loss_fn_output_type": msg.loss_fn_output_type,
            "loss_fn_outputs": outputs,
            "metrics": dict(msg.metrics),
        }
    )


__all__ = ["decode_forward_backward", "result_as_json", "wants_protobuf"]
