"""Tinker's protobuf wire format (``tinker_public``): decode requests, encode results.

Requests arrive as ``ForwardBackwardRequest`` (maybe zstd-compressed); ``forward_backward`` and
``asample`` results must go back as ``ForwardBackwardOutput`` / ``SampleResponse`` bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from twinkle.server.web.errors import BadRequest

PROTOBUF = "application/x-protobuf"
# Proto DType -> numpy (FLOAT32=1, INT64=2, INT32=3, BF16=4 as raw uint16).
_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32, 4: np.uint16}


def _pb():
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


@dataclass
class WireDatum:
    """One Tinker datum: its input tokens and its ``loss_fn_inputs`` as flat numpy arrays."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # as sent; may be empty
    # Image chunks, in order: (token position they start at, bytes, format, expected_tokens);
    # ``tinker.images.expand_datums`` turns them into image tokens and pixel_values.
    images: list[tuple[int, bytes, str, int | None]] = field(default_factory=list)
    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None


@dataclass
class WireForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """Undo ``Content-Encoding: zstd`` (bounded by ``max_bytes``); identity passes through."""
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("identity", ""):
        return body
    if encoding != "zstd":
        raise BadRequest(f"unsupported Content-Encoding {encoding!r}; use zstd or none")
    import zstandard

    try:
        reader = zstandard.ZstdDecompressor().stream_reader(body)
        out = reader.read(max_bytes + 1)
    except zstandard.ZstdError as exc:
        raise BadRequest(f"malformed zstd body: {exc}") from None
    if len(out) > max_bytes:
        raise BadRequest(f"decompressed body is over the limit of {max_bytes} bytes")
    return out


def _tensor(msg: Any, where: str) -> np.ndarray:
    dtype = _DTYPES.get(msg.dtype)
    if dtype is None:
        raise BadRequest(f"{where}: unsupported tensor dtype {msg.dtype}")
    if msg.HasField("sparse_csr"):
        return _dense_from_csr(msg, dtype, where)
    raw = msg.dense
    if len(raw) % np.dtype(dtype).itemsize:
        raise BadRequest(
            f"{where}: {len(raw)} bytes is not a whole number of {np.dtype(dtype).name}"
        )
    array = np.frombuffer(raw, dtype=dtype)
    if dtype is np.uint16:  # bfloat16: the upper half of a float32
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.reshape(-1).copy()


def _dense_from_csr(msg: Any, dtype: Any, where: str) -> np.ndarray:
    shape = list(msg.shape)
    if len(shape) != 2:
        raise BadRequest(f"{where}: a sparse tensor must be 2-D")
    values = np.frombuffer(msg.sparse_csr.values, dtype=dtype)
    crow = np.frombuffer(msg.sparse_csr.crow_indices, dtype=np.int64)
    col = np.frombuffer(msg.sparse_csr.col_indices, dtype=np.int64)
    dense = np.zeros(shape, dtype=dtype)
    try:
        for r in range(shape[0]):
            dense[r, col[crow[r] : crow[r + 1]]] = values[crow[r] : crow[r + 1]]
    except (IndexError, ValueError) as exc:
        raise BadRequest(f"{where}: malformed sparse tensor ({exc})") from None
    return dense.reshape(-1)


def decode_forward_backward(body: bytes) -> WireForwardBackward:
    """Parse a ``ForwardBackwardRequest``; encoded-text and image chunks are supported."""
    msg = _pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError
        raise BadRequest(f"malformed ForwardBackwardRequest protobuf: {exc}") from None
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    for i, datum in enumerate(msg.data):
        tokens: list[int] = []
        images: list[tuple[int, bytes, str, int | None]] = []
        for chunk in datum.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind == "image":
                image = chunk.image
                expected = image.expected_tokens if image.HasField("expected_tokens") else None
                images.append((len(tokens), bytes(image.data), image.format, expected))
                continue
            if kind != "encoded_text":
                raise BadRequest(
                    f"data[{i}]: only encoded_text and image chunks are supported by this server"
                )
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise BadRequest(f"data[{i}]: token bytes are not int32")
            tokens.extend(np.frombuffer(raw, dtype=np.int32).tolist())
        inputs = {
            name: _tensor(t, f"data[{i}].loss_fn_inputs[{name!r}]")
            for name, t in datum.loss_fn_inputs.items()
        }
        shapes = {name: tuple(t.shape) for name, t in datum.loss_fn_inputs.items()}
        data.append(WireDatum(tokens, inputs, shapes, images))
    return WireForwardBackward(
        msg.model_id, int(msg.seq_id), msg.loss_fn, config, bool(msg.forward_only), data
    )


def _batched(arrays: list[np.ndarray], dtype: Any, proto_dtype: int) -> Any:
    pb = _pb()
    parts = [np.ascontiguousarray(a, dtype=dtype).reshape(-1) for a in arrays]
    sizes = np.array([0] + [p.nbytes for p in parts], dtype=np.int64)
    return pb.BatchedTensor(
        data=b"".join(p.tobytes() for p in parts),
        offsets=np.cumsum(sizes).tobytes(),
        dtype=proto_dtype,
    )


def encode_forward_backward_output(
    outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]
) -> bytes:
    """``ForwardBackwardOutput`` with one ArrayRecord of per-datum float32 fields."""
    pb = _pb()
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(outputs))
    for name in dict.fromkeys(k for out in outputs for k in out):
        record.fields[name].CopyFrom(
            _batched([out[name] for out in outputs], np.float32, pb.DTYPE_FLOAT32)
        )
    msg = pb.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord", metrics={k: float(v) for k, v in metrics.items()}
    )
    msg.loss_fn_outputs.append(record)
    return msg.SerializeToString()


def _float_bytes(values: list[float | None]) -> bytes:
    array = np.array([math.nan if v is None else float(v) for v in values], dtype=np.float32)
    return array.tobytes()


def encode_sample_response(
    sequences: list[dict[str, Any]], prompt_logprobs: list[float | None] | None
) -> bytes:
    """``SampleResponse``: tokens int32, logprobs float32, prompt logprobs with NaN for none."""
    pb = _pb()
    msg = pb.SampleResponse()
    for seq in sequences:
        out = msg.sequences.add()
        out.stop_reason = (
            pb.STOP_REASON_LENGTH if seq.get("stop_reason") == "length" else pb.STOP_REASON_STOP
        )
        out.tokens = np.asarray(seq.get("tokens") or [], dtype=np.int32).tobytes()
        if seq.get("logprobs") is not None:
            out.logprobs = _float_bytes(seq["logprobs"])
    if prompt_logprobs is not None:
        msg.prompt_logprobs = _float_bytes(prompt_logprobs)
    return msg.SerializeToString()
