"""Split one tenant's micro-batch by rows across data-parallel ranks, and join the results."""

from __future__ import annotations

from typing import Any

import numpy as np

PER_ROW_KEYS = (
    "advantages",
    "old_logprobs",
    "ref_logprobs",
    "weights",
    "old_logps",
    "ref_logps",
    "target_values",
    "teacher_topk_logprobs",
    "teacher_topk_indices",
    "teacher_logits",
)


def row_count(inputs: Any) -> int:
    """How many rows (samples) ``inputs`` holds: collated tensors, one sample, or a list."""
    if isinstance(inputs, dict):
        ids = inputs.get("input_ids")
        if hasattr(ids, "shape") and len(getattr(ids, "shape", ())) == 2:
            return int(ids.shape[0])
        return 1
    return len(list(inputs))


def shard_bounds(rows: int, parts: int, unit: int = 1) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` row ranges, as even as possible, cut on ``unit`` boundaries.

    ``unit=2`` keeps DPO's (chosen, rejected) pairs together; a leftover row (an odd DPO batch)
    goes to the last non-empty range, whose loss then reports it.
    """
    units, leftover = divmod(rows, unit)
    base, extra = divmod(units, parts)
    bounds, start = [], 0
    for rank in range(parts):
        end = start + (base + (rank < extra)) * unit
        bounds.append((start, end))
        start = end
    if leftover:
        last = max((i for i, (s, e) in enumerate(bounds) if e > s), default=0)
        bounds[last] = (bounds[last][0], bounds[last][1] + leftover)
        for i in range(last + 1, parts):
            bounds[i] = (rows, rows)
    return bounds


def _take(value: Any, start: int, end: int, rows: int) -> Any:
    if hasattr(value, "shape") and len(value.shape) >= 1 and value.shape[0] == rows:
        return value[start:end]
    if isinstance(value, (list, tuple)) and len(value) == rows:
        return list(value[start:end])
    return value


def _slice_inputs(inputs: Any, start: int, end: int, rows: int) -> Any:
    if isinstance(inputs, dict):
        if row_count(inputs) == 1 and not hasattr(inputs.get("input_ids"), "shape"):
            return inputs
        return {k: _take(v, start, end, rows) for k, v in inputs.items()}
    return list(inputs)[start:end]


def split_request(
    request: dict[str, Any], bounds: list[tuple[int, int]]
) -> list[dict[str, Any] | None]:
    """One request (``{'inputs': ..., **loss_kwargs}``) per rank; ``None`` where a rank has no row.

    Per-row loss inputs (``PER_ROW_KEYS`` and the per-row fields of a ``ref_outputs`` result) are
    split with the rows; every other keyword goes to each rank unchanged.
    """
    inputs = request["inputs"]
    rows = row_count(inputs)
    shards: list[dict[str, Any] | None] = []
    for start, end in bounds:
        if end <= start:
            shards.append(None)
            continue
        shard = {"inputs": _slice_inputs(inputs, start, end, rows)}
        for key, value in request.items():
            if key == "inputs":
                continue
            if key == "ref_outputs" and isinstance(value, dict):  # a forward_only result
                shard[key] = {k: _take(v, start, end, rows) for k, v in value.items()}
            else:
                shard[key] = _take(value, start, end, rows) if key in PER_ROW_KEYS else value
        shards.append(shard)
    return shards


def join_logprobs(parts: list[list[Any]]) -> list[Any]:
    """Per-row log-probs of the ranks, back in the original row order."""
    return [np.asarray(row) for part in parts for row in part]


def join_results(name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """A tenant's ``forward_backward`` result from the ranks' shards (rank order = row order)."""
    parts = [r[name] for r in results]
    with_rows = [p for p in parts if "logprobs" in p]
    rows = [len(p["logprobs"]) for p in with_rows]
    return {
        "loss": parts[0]["global_loss"],
        "logprobs": join_logprobs([p["logprobs"] for p in with_rows]),
        "num_tokens": sum(p["num_tokens"] for p in with_rows),
        "metrics": {
            **mean_metrics([p.get("metrics", {}) for p in with_rows], rows),
            "loss": parts[0]["global_loss"],
        },
    }


def mean_metrics(metrics: list[dict[str, float]], rows: list[int]) -> dict[str, float]:
    """Row-weighted mean of each metric over the ranks that report it."""
    out = {}
    for key in {k for m in metrics for k in m}:
        pairs = [(m[key], r) for m, r in zip(metrics, rows) if key in m]
        weight = sum(r for _, r in pairs)
        out[key] = sum(v * r for v, r in pairs) / weight if weight else pairs[0][0]
    return out


__all__ = [
    "PER_ROW_KEYS",
    "join_logprobs",
    "join_results",
    "mean_metrics",
    "row_count",
    "shard_bounds",
    "split_request",
]
