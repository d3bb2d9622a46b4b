"""The multi-LoRA linear operation: rows grouped in segments, each segment with its own adapter.

``y[s:e] = scaling_k * dropout_k(x[s:e]) @ A_k.T @ B_k.T`` for each segment ``k`` covering rows
``s:e``; rows outside every segment get zero. Ranks may differ per segment: nothing is padded to the
largest rank. This module is the torch reference (CPU, and the fallback everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class LoraSegment:
    """Rows ``start:end`` (along dim 0) use ``lora_A`` ([r, in]) and ``lora_B`` ([out, r])."""

    start: int
    end: int
    lora_A: torch.Tensor
    lora_B: torch.Tensor
    scaling: float
    dropout: Callable[[torch.Tensor], torch.Tensor] | None = None


def segmented_lora_reference(x: torch.Tensor, segments: list[LoraSegment], out_features: int) -> torch.Tensor:
    """LoRA deltas for every row of ``x`` ([rows, ..., in]) by segment; a differentiable torch path.

    Args:
        x: Input activations; dim 0 indexes rows (sequences).
        segments: Non-overlapping segments sorted by ``start``.
        out_features: Output width, for the zero rows between segments.

    Returns:
        A tensor shaped like ``x`` with the last dim ``out_features``.
    """
    rows = x.shape[0]
    if len(segments) == 1 and segments[0].start == 0 and segments[0].end == rows:
        return _segment_delta(x, segments[0])
    pieces: list[torch.Tensor] = []
    cursor = 0
    for seg in segments:
        if seg.start > cursor:
            pieces.append(x.new_zeros((seg.start - cursor, *x.shape[1:-1], out_features)))
        pieces.append(_segment_delta(x[seg.start : seg.end], seg))
        cursor = seg.end
    if cursor < rows:
        pieces.append(x.new_zeros((rows - cursor, *x.shape[1:-1], out_features)))
    return torch.cat(pieces, dim=0)


def _segment_delta(x: torch.Tensor, seg: LoraSegment) -> torch.Tensor:
    if seg.dropout is not None:
        x = seg.dropout(x)
    hidden = torch.nn.functional.linear(x, seg.lora_A)
    return torch.nn.functional.linear(hidden, seg.lora_B) * seg.scaling
