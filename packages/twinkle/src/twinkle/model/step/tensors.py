"""From a tenant's inputs to model tensors, and from logits to per-token log-probabilities.

Conventions: ``labels`` are aligned with ``input_ids`` (Hugging Face style, -100 = not trained);
the model predicts ``labels[t + 1]`` at position ``t``. Per-token extras (``advantages``,
``old_logprobs``) given per input position are shifted the same way as labels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from twinkle.data_format import IGNORE_INDEX
from twinkle.errors import InvalidArgumentError

PER_TOKEN_KEYS = ("advantages", "old_logprobs", "ref_logprobs", "weights", "target_values")


def shift_left(values: torch.Tensor, fill: float | int) -> torch.Tensor:
    """``out[:, t] = values[:, t + 1]``, the last column filled with ``fill``."""
    out = torch.full_like(values, fill)
    out[:, :-1] = values[:, 1:]
    return out


# On the CPU the log-softmax runs over chunks of about this many fp32 bytes (see token_logprobs).
CPU_CHUNK_BYTES = 2 << 20
MIN_CHUNK_TOKENS = 16


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, chunk_bytes: int | None = None
) -> torch.Tensor:
    """``log p(targets[b, t])`` from ``logits[b, t]`` in fp32; 0 where the target is -100.

    On the CPU the tokens go through the cross-entropy in chunks of ~2 MiB of fp32 logits: a
    whole batch's log-softmax and its gradient stream several [tokens, vocab] tensors through
    memory, while a chunk's stay in cache. The values
    are the same (each token's log-probability depends only on its own row). Accelerator tensors
    take one call, as kernel launches there cost more than the cache saves. ``chunk_bytes``:
    ``ExecutionOptions.logprob_chunk_bytes`` (default :data:`CPU_CHUNK_BYTES`).
    """
    batch, seq, vocab = logits.shape
    flat_logits = logits.reshape(batch * seq, vocab)
    flat_targets = targets.reshape(-1)
    chunk = max(MIN_CHUNK_TOKENS, (chunk_bytes or CPU_CHUNK_BYTES) // (4 * vocab))
    if logits.device.type != "cpu" or flat_logits.shape[0] <= chunk:
        nll = _nll(flat_logits, flat_targets)
    else:
        nll = torch.cat(
            [_nll(lg, tg) for lg, tg in zip(flat_logits.split(chunk), flat_targets.split(chunk))]
        )
    return -nll.reshape(batch, seq)


@torch.no_grad()
def token_entropies(logits: torch.Tensor, chunk_bytes: int | None = None) -> torch.Tensor:
    """``[B, T]`` entropy of each position's predicted distribution (fp32, no gradient), in
    chunks of tokens as :func:`token_logprobs` takes them."""
    batch, seq, vocab = logits.shape
    flat = logits.detach().reshape(batch * seq, vocab)
    chunk = max(MIN_CHUNK_TOKENS, (chunk_bytes or CPU_CHUNK_BYTES) // (4 * vocab))
    parts = []
    for rows in flat.split(chunk):
        logp = torch.log_softmax(rows.float(), dim=-1)
        parts.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(parts).reshape(batch, seq)


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="none"
    )


def as_float_tensor(value: Any, rows: int, seq: int, name: str) -> torch.Tensor:
    """A per-row ([B]) or per-token ([B, T], rows may be ragged) value as a float tensor.

    Per-token values are shifted like labels and zero-padded to ``seq``.

    Raises:
        ValueError: When the value has the wrong number of rows or is longer than the batch.
    """
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if (
        isinstance(value, np.ndarray)
        and value.ndim <= 1
        or (isinstance(value, (list, tuple)) and all(np.ndim(v) == 0 for v in value))
    ):
        array = np.asarray(value, dtype=np.float32).reshape(-1)
        if array.shape[0] != rows:
            raise InvalidArgumentError(f"{name}: {array.shape[0]} values for {rows} rows")
        return torch.from_numpy(array.copy())
    return shift_left(pad_rows(value, rows, seq, name), 0.0)


def is_collated(inputs: Any) -> bool:
    return isinstance(inputs, dict) and isinstance(inputs.get("input_ids"), torch.Tensor)


def split_inputs(inputs: Any) -> tuple[list[Any], bool]:
    """Inputs as a list of samples, and whether they still need the template (trajectories)."""
    if isinstance(inputs, dict):
        inputs = [inputs]
    items = list(inputs)
    if not items:
        raise InvalidArgumentError("inputs is empty")
    needs_template = [not _has_tokens(item) for item in items]
    if any(needs_template) and not all(needs_template):
        raise InvalidArgumentError(
            "inputs mix encoded features and raw trajectories; pass one kind"
        )
    return items, needs_template[0]


def _has_tokens(item: Any) -> bool:
    if isinstance(item, dict):
        return "input_ids" in item
    return hasattr(item, "input_ids") and not hasattr(item, "messages")


def pad_rows(value: Any, rows: int, seq: int, name: str) -> torch.Tensor:
    """Per-row sequences of values as a zero-padded ``[rows, seq]`` float tensor.

    Raises:
        InvalidArgumentError: Another number of rows, or a row longer than ``seq``.
    """
    rows_list = list(value)
    if len(rows_list) != rows:
        raise InvalidArgumentError(
            f"{name}: {len(rows_list)} rows of values for {rows} rows of inputs"
        )
    out = torch.zeros(rows, seq, dtype=torch.float32)
    for i, row in enumerate(rows_list):
        row = np.asarray(row, dtype=np.float32).reshape(-1)
        if row.shape[0] > seq:
            raise InvalidArgumentError(
                f"{name}: row {i} has {row.shape[0]} values, longer than its {seq} tokens"
            )
        out[i, : row.shape[0]] = torch.from_numpy(row)
    return out
