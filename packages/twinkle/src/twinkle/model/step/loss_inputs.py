"""Loss inputs in the forms scripts send them, put on a batch's ``[B, T]`` target grid.

Three forms of a per-token value reach a batch, row by row:

* one value per row (``advantages=[1.0, -0.5]``): broadcast over the row's tokens;
* one value per input position, as long as the row's ``input_ids``: shifted like ``labels``
  (for Tinker-style ``target_tokens``: as given);
* one value per trained token (as long as the row's trained positions, as a sampler's
  completion logprobs or ``forward_only``'s ``logprobs`` are): scattered onto those positions.

Plus ModelScope Twinkle's spellings: ``old_logps`` / ``ref_logps`` for ``old_logprobs`` /
``ref_logprobs``, ``ref_outputs`` (a ``forward_only`` result) for the reference, and a teacher's
top-k distribution (``teacher_topk_logprobs`` + ``teacher_topk_indices``, or in-process
``teacher_logits``) for distillation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from twinkle.errors import InvalidArgumentError
from twinkle.model.step.tensors import as_float_tensor, pad_rows, shift_left

#: Upstream names of loss inputs, and ours.
KEY_ALIASES = {"old_logps": "old_logprobs", "ref_logps": "ref_logprobs"}
#: ``[B, T, K]`` inputs of distillation: the teacher's top-k log-probs and their token ids.
TOPK_KEYS = ("teacher_topk_logprobs", "teacher_topk_indices")


def rename_aliases(kwargs: dict[str, Any]) -> None:
    """Rename upstream spellings in place (``old_logps`` -> ``old_logprobs``, ...).

    Raises:
        InvalidArgumentError: both spellings of one input were given.
    """
    for alias, name in KEY_ALIASES.items():
        if alias in kwargs:
            if kwargs.get(name) is not None:
                raise InvalidArgumentError(f"pass {name!r} or {alias!r}, not both")
            kwargs[name] = kwargs.pop(alias)


def chosen_token_logprobs(value: Any) -> Any:
    """A sampler's per-token logprobs given as ``(token_id, logprob)`` pairs (top-k per token,
    ``[n, k, 2]``, or one pair per token, ``[n, 2]``) reduced to the sampled token's logprob
    per token; plain per-token floats pass unchanged."""
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        return value
    out = []
    for row in value:
        array = np.asarray(row, dtype=np.float64) if _is_numeric(row) else None
        if array is not None and array.ndim == 3 and array.shape[-1] == 2:
            row = array[:, 0, 1]
        elif array is not None and array.ndim == 2 and array.shape[-1] == 2:
            row = array[:, 1]
        out.append(row)
    return out


def on_grid(
    value: Any, mask: torch.Tensor, name: str, alignment: str, seq: int | None = None
) -> torch.Tensor:
    """``value`` (any of the three forms) as a ``[B, T]`` float tensor on the targets' grid."""
    rows, width = mask.shape
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if _per_row(value):
        return as_float_tensor(value, rows, width, name)
    value = list(value)
    if len(value) != rows:
        raise InvalidArgumentError(f"{name}: {len(value)} rows of values for {rows} rows of inputs")
    trained = mask.sum(-1).long().tolist()
    arrays = [np.asarray(v, dtype=np.float32).reshape(-1) for v in value]
    out = _positions(arrays, mask, alignment, name)
    for i, (array, count) in enumerate(zip(arrays, trained)):
        if array.shape[0] == count and count:
            out[i] = 0.0
            out[i, mask[i].bool()] = torch.from_numpy(array.copy())
    return out


def ref_from_outputs(ref_outputs: Any, mask: torch.Tensor, alignment: str) -> torch.Tensor:
    """The reference log-probs that ``forward_only(..., disable_lora=True)`` returned, on the
    batch's grid: its per-row ``logprobs`` (or upstream's ``logps``) hold one value per trained
    token, or one per position of the grid.

    Raises:
        InvalidArgumentError: no log-probs in ``ref_outputs``, or rows of another length.
    """
    outputs = getattr(ref_outputs, "result", ref_outputs)
    if not isinstance(outputs, dict):
        raise InvalidArgumentError(
            "ref_outputs must be what forward_only returned (a dict with 'logprobs'), "
            f"got {type(outputs).__name__}"
        )
    rows = outputs.get("logprobs", outputs.get("logps"))
    if rows is None:
        raise InvalidArgumentError(
            f"ref_outputs has no 'logprobs' (keys: {', '.join(map(str, outputs)) or 'none'})"
        )
    if isinstance(rows, torch.Tensor):
        rows = list(rows.detach().cpu().numpy())
    rows = list(rows)
    batch_rows, width = mask.shape
    if len(rows) != batch_rows:
        raise InvalidArgumentError(
            f"ref_outputs: {len(rows)} rows of logprobs for {batch_rows} rows of inputs; "
            "run forward_only on the same inputs"
        )
    out = torch.zeros(batch_rows, width)
    for i, row in enumerate(rows):
        array = torch.as_tensor(np.asarray(row, dtype=np.float32).reshape(-1))
        where = mask[i].bool()
        if array.shape[0] == int(where.sum()):
            out[i, where] = array
        elif array.shape[0] == width:
            out[i] = array * mask[i]
        else:
            raise InvalidArgumentError(
                f"ref_outputs: row {i} has {array.shape[0]} logprobs but {int(where.sum())} "
                "trained tokens; run forward_only on the same inputs"
            )
    return out


def topk_on_grid(
    kwargs: dict[str, Any], mask: torch.Tensor, alignment: str
) -> dict[str, torch.Tensor]:
    """The teacher's ``[B, T, K]`` top-k log-probs and token ids (popped from ``kwargs``), on the
    targets' grid; empty when none were given.

    ``teacher_topk_*`` rows hold ``[n, K]`` values per input position (shifted like labels) or
    per trained token. In-process ``teacher_logits`` ``[B, T, V]`` are on the logits' grid (as a
    teacher's forward returns them, position ``t`` predicting the next token) and are reduced to
    their ``topk`` largest (all of them when ``topk`` is None).

    Raises:
        InvalidArgumentError: one of the pair without the other, or shapes that disagree.
    """
    logits = kwargs.pop("teacher_logits", None)
    topk = kwargs.pop("topk", None)
    given = {key: kwargs.pop(key, None) for key in TOPK_KEYS}
    if logits is not None:
        return _from_logits(torch.as_tensor(logits), topk, mask)
    if all(v is None for v in given.values()):
        return {}
    if any(v is None for v in given.values()):
        raise InvalidArgumentError(
            "distillation needs both teacher_topk_logprobs and teacher_topk_indices"
        )
    out = {key: _topk_rows(value, mask, key, alignment) for key, value in given.items()}
    if out[TOPK_KEYS[0]].shape != out[TOPK_KEYS[1]].shape:
        raise InvalidArgumentError(
            f"teacher_topk_logprobs {tuple(out[TOPK_KEYS[0]].shape)} and teacher_topk_indices "
            f"{tuple(out[TOPK_KEYS[1]].shape)} differ in shape"
        )
    out["teacher_topk_indices"] = out["teacher_topk_indices"].long()
    return out


def _from_logits(logits: torch.Tensor, topk: int | None, mask: torch.Tensor) -> dict:
    rows, width = mask.shape
    if logits.dim() != 3 or logits.shape[0] != rows or logits.shape[1] < width:
        raise InvalidArgumentError(
            f"teacher_logits must be [B, T, V] with B={rows} and T>={width}, got "
            f"{tuple(logits.shape)}"
        )
    logits = logits[:, :width].float()
    if topk is not None:
        values, indices = torch.topk(logits, k=int(topk), dim=-1)
    else:
        values = logits
        indices = torch.arange(logits.shape[-1]).expand_as(logits)
    return {"teacher_topk_logprobs": values, "teacher_topk_indices": indices.long()}


def _topk_rows(value: Any, mask: torch.Tensor, name: str, alignment: str) -> torch.Tensor:
    rows, width = mask.shape
    if isinstance(value, torch.Tensor) and value.dim() == 3:
        value = list(value.detach().cpu().numpy())
    value = list(value)
    if len(value) != rows:
        raise InvalidArgumentError(f"{name}: {len(value)} rows for {rows} rows of inputs")
    arrays = [np.asarray(v, dtype=np.float64) for v in value]
    ks = {a.shape[-1] for a in arrays if a.ndim == 2}
    if len(ks) != 1 or any(a.ndim != 2 for a in arrays):
        raise InvalidArgumentError(f"{name}: each row must be [tokens, K] with one K for all")
    k = ks.pop()
    out = torch.zeros(rows, width, k, dtype=torch.float64)
    for i, array in enumerate(arrays):
        where = mask[i].bool()
        tensor = torch.from_numpy(array.copy())
        if array.shape[0] == int(where.sum()) and array.shape[0]:
            out[i, where] = tensor
            continue
        if alignment == "shifted":
            tensor = tensor[1:]
        if tensor.shape[0] > width:
            raise InvalidArgumentError(
                f"{name}: row {i} has {array.shape[0]} positions, longer than its {width} tokens"
            )
        out[i, : tensor.shape[0]] = tensor
    return out


def _positions(arrays: list[np.ndarray], mask: torch.Tensor, alignment: str, name: str):
    """Per-input-position rows on the grid: zero-padded, shifted like labels when shifted."""
    rows, width = mask.shape
    grid = pad_rows(arrays, rows, width, name) if _fits(arrays, width) else None
    if grid is None:
        raise InvalidArgumentError(f"{name}: a row has more values than the batch has tokens")
    return shift_left(grid, 0.0) if alignment == "shifted" else grid


def _fits(arrays: list[np.ndarray], width: int) -> bool:
    return all(a.shape[0] <= width for a in arrays)


def _per_row(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim <= 1
    return isinstance(value, (list, tuple)) and all(np.ndim(v) == 0 for v in value)


def _is_numeric(row: Any) -> bool:
    try:
        np.asarray(row, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return True


__all__ = [
    "KEY_ALIASES",
    "TOPK_KEYS",
    "chosen_token_logprobs",
    "on_grid",
    "ref_from_outputs",
    "rename_aliases",
    "topk_on_grid",
]
