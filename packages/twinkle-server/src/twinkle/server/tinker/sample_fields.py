"""The 0.38 ``SampleRequest`` fields beyond plain sampling: top-k logprobs, a scored prompt
suffix, target prompt logprobs, prompt alt-token draws; parsed for the sampler and written into
the protobuf ``SampleResponse`` in the SDK's shapes (``tinker.types.sample_response``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tinker import types

from twinkle.server.web.errors import BadRequest

MASK_LOGPROB = -99999.0  # the SDK's "no entry" in a top-k row (``TopkLogprobs``), with token 0


@dataclass
class TargetLayout:
    """The request's ``target_prompt_logprobs`` tensor: ``[len(prompt) - 1, K]``, maybe CSR."""

    ids: np.ndarray  # dense int64 [L - 1, K], -1 where nothing is asked
    crow: np.ndarray | None = None
    col: np.ndarray | None = None


def sampler_params(
    body: types.SampleRequest, prompt_len: int
) -> tuple[dict[str, Any], TargetLayout | None]:
    """The Twinkle ``SamplingParams`` fields these request fields ask for, and the target layout.

    Raises:
        BadRequest: negative counts, a ``prompt_logprobs_last_n`` outside ``[1, len(prompt) - 1]``
            or without ``prompt_logprobs``, or a target tensor of the wrong shape or dtype.
    """
    params: dict[str, Any] = {}
    for tinker_name, twinkle_name in (
        ("topk_sample_logprobs", "topk_logprobs"),
        ("topk_prompt_logprobs", "topk_prompt_logprobs"),
        ("prompt_alt_tokens_k", "prompt_alt_tokens_k"),
    ):
        value = getattr(body, tinker_name)
        if value < 0:
            raise BadRequest(f"{tinker_name} must be an integer >= 0, got {value!r}")
        if value:
            params[twinkle_name] = value
    last_n = body.prompt_logprobs_last_n
    if last_n is not None:
        if not 1 <= last_n < prompt_len:
            raise BadRequest(
                f"prompt_logprobs_last_n must be between 1 and len(prompt) - 1 = {prompt_len - 1}, "
                f"got {last_n!r}"
            )
        if not body.prompt_logprobs:
            raise BadRequest("prompt_logprobs_last_n requires prompt_logprobs")
        params["prompt_logprobs_last_n"] = last_n
    layout = None
    if body.target_prompt_logprobs is not None:
        layout = _target_layout(body.target_prompt_logprobs, prompt_len)
        params["target_prompt_token_ids"] = layout.ids.tolist()
    return params, layout


def _target_layout(tensor: Any, prompt_len: int) -> TargetLayout:
    if tensor.dtype != "int64":
        raise BadRequest("target_prompt_logprobs must be an int64 TensorData")
    data = np.asarray(tensor.data or [], dtype=np.int64)
    shape = tensor.shape or [data.shape[0]]
    if len(shape) != 2 or shape[0] != prompt_len - 1:
        raise BadRequest(
            f"target_prompt_logprobs must have shape [len(prompt) - 1, K] = [{prompt_len - 1}, K], "
            f"got {shape}"
        )
    crow, col = tensor.sparse_crow_indices, tensor.sparse_col_indices
    if crow is None:
        if data.size != shape[0] * shape[1]:
            raise BadRequest(f"target_prompt_logprobs has {data.size} values for shape {shape}")
        return TargetLayout(data.reshape(shape))
    crow_R, col_N = np.asarray(crow, dtype=np.int64), np.asarray(col or [], dtype=np.int64)
    ids = np.full(shape, -1, dtype=np.int64)
    try:
        for r in range(shape[0]):
            ids[r, col_N[crow_R[r] : crow_R[r + 1]]] = data[crow_R[r] : crow_R[r + 1]]
    except (IndexError, ValueError) as exc:
        raise BadRequest(f"target_prompt_logprobs: malformed sparse tensor ({exc})") from None
    return TargetLayout(ids, crow_R, col_N)


def _topk_message(pb: Any, rows: list, k: int) -> Any:
    """``TopkLogprobs`` of ``(length, k)``: ``None`` rows and short rows padded with the mask."""
    ids = np.zeros((len(rows), k), dtype=np.int32)
    lps = np.full((len(rows), k), MASK_LOGPROB, dtype=np.float32)
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate((row or [])[:k]):
            ids[i, j], lps[i, j] = token, logprob
    return pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k, length=len(rows))


def _tensor(pb: Any, array: np.ndarray, proto_dtype: int) -> Any:
    return pb.Tensor(dense=array.tobytes(), dtype=proto_dtype, shape=list(array.shape))


def add_to_response(
    data: bytes, result: dict[str, Any], params: dict[str, Any], layout: TargetLayout | None
) -> bytes:
    """``SampleResponse`` bytes with the fields ``params`` asked for added from ``result``."""
    if not params:
        return data
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.SampleResponse()
    msg.ParseFromString(data)
    if k := params.get("topk_logprobs"):
        for out, seq in zip(msg.sequences, result["sequences"]):
            out.topk_sampled_logprobs.CopyFrom(_topk_message(pb, seq.get("topk_logprobs") or [], k))
    if k := params.get("topk_prompt_logprobs"):
        msg.topk_prompt_logprobs.CopyFrom(_topk_message(pb, result["topk_prompt_logprobs"], k))
    if layout is not None:
        values = np.asarray(result["target_prompt_logprobs"], dtype=np.float32).reshape(
            layout.ids.shape
        )
        if layout.crow is None:
            msg.target_prompt_logprobs.CopyFrom(_tensor(pb, values, pb.DTYPE_FLOAT32))
        else:
            rows = np.repeat(np.arange(values.shape[0]), np.diff(layout.crow))
            msg.target_prompt_logprobs.CopyFrom(
                pb.Tensor(
                    sparse_csr=pb.SparseCsr(
                        values=values[rows, layout.col].astype(np.float32).tobytes(),
                        crow_indices=layout.crow.tobytes(),
                        col_indices=layout.col.tobytes(),
                    ),
                    dtype=pb.DTYPE_FLOAT32,
                    shape=list(values.shape),
                )
            )
    if k := params.get("prompt_alt_tokens_k"):
        pairs = result["prompt_alt_tokens"]
        ids = np.asarray([[t for t, _ in row] for row in pairs], dtype=np.int64).reshape(-1, k)
        lps = np.asarray([[lp for _, lp in row] for row in pairs], dtype=np.float32).reshape(-1, k)
        msg.prompt_alt_tokens.tokens.CopyFrom(_tensor(pb, ids, pb.DTYPE_INT64))
        msg.prompt_alt_tokens.logprobs.CopyFrom(_tensor(pb, lps, pb.DTYPE_FLOAT32))
    return msg.SerializeToString()
