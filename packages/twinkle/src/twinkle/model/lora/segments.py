"""What the multi-LoRA op takes: row segments, each with its own adapter, and their checks.

Both kernels (``torch_kernel``, ``triton_kernel``) check their segments with
:func:`validate_segments` and draw dropout with :func:`dropout_masks`, so they refuse the same
inputs and a seeded run draws the same masks on either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

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

    @property
    def rows(self) -> int:
        return self.end - self.start


def validate_segments(x: torch.Tensor, segments: Sequence[LoraSegment], out_features: int) -> None:
    """Check that ``segments`` can run over ``x`` ([rows, ..., in]) into ``out_features``.

    Raises:
        ValueError: ``x`` has fewer than 2 dims; a segment lies outside ``x``'s rows, is not
            sorted by ``start`` or overlaps the one before; its ``lora_A`` is not ``[r, in]`` or
            its ``lora_B`` not ``[out_features, r]``; or its weights are on another device.
    """
    if x.dim() < 2:
        raise ValueError(f"x must be [rows, ..., in]; got shape {tuple(x.shape)}")
    rows, in_f = x.shape[0], x.shape[-1]
    previous: LoraSegment | None = None
    for seg in segments:
        span = f"{seg.start}:{seg.end}"
        if not 0 <= seg.start <= seg.end <= rows:
            raise ValueError(f"segment {span} is not a row range within the input's {rows} rows")
        if previous is not None and seg.start < previous.start:
            raise ValueError(
                f"segments must be sorted by start and non-overlapping; segment {span} comes "
                f"after {previous.start}:{previous.end}"
            )
        if previous is not None and seg.start < previous.end:
            raise ValueError(
                f"segments must be sorted by start and non-overlapping; segment {span} overlaps "
                f"{previous.start}:{previous.end}"
            )
        r = seg.lora_A.shape[0]
        if tuple(seg.lora_A.shape) != (r, in_f) or tuple(seg.lora_B.shape) != (out_features, r):
            raise ValueError(
                f"segment {span}: lora_A {tuple(seg.lora_A.shape)} / lora_B "
                f"{tuple(seg.lora_B.shape)} do not fit in={in_f}, out={out_features} "
                f"(want [r, {in_f}] and [{out_features}, r])"
            )
        if seg.lora_A.device != x.device or seg.lora_B.device != x.device:
            raise ValueError(
                f"segment {span}: x is on {x.device} but lora_A/lora_B are on "
                f"{seg.lora_A.device}/{seg.lora_B.device}"
            )
        previous = seg


def dropout_masks(
    x: torch.Tensor, segments: Sequence[LoraSegment]
) -> tuple[torch.Tensor | None, ...]:
    """Per segment, its dropout as a multiplicative mask over its tokens (None without dropout).

    Each mask is ``[rows_k * tokens_per_row, in]``, the segment's slice of ``x`` flattened to
    tokens. Dropout is elementwise ``x * mask``; drawing it on ones of the segment's shape
    consumes the random stream exactly as ``dropout(x[s:e])`` would, so seeded runs match the
    per-segment loop.
    """
    masks = []
    for seg in segments:
        if seg.dropout is None:
            masks.append(None)
        else:
            ones = x.new_ones((seg.rows, *x.shape[1:]))
            masks.append(seg.dropout(ones).reshape(-1, x.shape[-1]))
    return tuple(masks)
