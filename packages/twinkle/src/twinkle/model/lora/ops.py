"""The multi-LoRA linear operation: rows grouped in segments, each segment with its own adapter.

``y[s:e] = scaling_k * dropout_k(x[s:e]) @ A_k.T @ B_k.T`` for each segment ``k`` covering rows
``s:e``; rows outside every segment get zero. Ranks may differ per segment: nothing is padded to the
largest rank. This module is the torch reference (CPU, and the fallback everywhere).

Segments that share a rank and a row count run as one batched matmul over their stacked ``A`` and
``B`` (two ``bmm`` per group instead of two ``linear`` per segment, forward and backward); a
segment alone in its group takes the plain per-segment path.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
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


def segmented_lora_reference(
    x: torch.Tensor, segments: list[LoraSegment], out_features: int
) -> torch.Tensor:
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
    groups = _groups(segments)
    # One split of x into the row ranges the groups read: its backward is a single cat, where
    # slicing x once per segment would zero-fill a full-size gradient per segment.
    units = sorted(_units(groups))
    views = dict(zip(units, _split_rows(x, units)))
    blocks: list[tuple[int, torch.Tensor]] = []  # (start row, delta rows), any order
    for group in groups:
        if len(group) == 1:
            blocks.append(
                (group[0].start, _segment_delta(views[(group[0].start, group[0].end)], group[0]))
            )
        else:
            blocks.extend(_group_deltas(x, views, group, out_features))
    return _assemble(x, sorted(blocks, key=lambda b: b[0]), out_features)


def _units(groups: list[list[LoraSegment]]) -> list[tuple[int, int]]:
    """Row ranges to view: a contiguous group's whole range, else each segment's own rows."""
    units = []
    for group in groups:
        if len(group) > 1 and _contiguous(group):
            units.append((group[0].start, group[-1].end))
        else:
            units.extend((seg.start, seg.end) for seg in group)
    return units


def _contiguous(group: list[LoraSegment]) -> bool:
    return all(a.end == b.start for a, b in zip(group, group[1:]))


def _split_rows(x: torch.Tensor, units: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Views of ``x`` for sorted, non-overlapping row ranges ``units`` (gaps dropped)."""
    sizes, keep, cursor = [], [], 0
    for start, end in units:
        if start > cursor:
            sizes.append(start - cursor)
            keep.append(False)
        sizes.append(end - start)
        keep.append(True)
        cursor = end
    if cursor < x.shape[0]:
        sizes.append(x.shape[0] - cursor)
        keep.append(False)
    return [view for view, kept in zip(torch.split(x, sizes), keep) if kept]


def _segmented_lora_loop(
    x: torch.Tensor, segments: list[LoraSegment], out_features: int
) -> torch.Tensor:
    """The same op, one segment at a time: the plain definition the grouped path is tested against."""
    blocks = [(seg.start, _segment_delta(x[seg.start : seg.end], seg)) for seg in segments]
    return _assemble(x, blocks, out_features)


def _segment_delta(x: torch.Tensor, seg: LoraSegment) -> torch.Tensor:
    if seg.dropout is not None:
        x = seg.dropout(x)
    hidden = torch.nn.functional.linear(x, seg.lora_A)
    return torch.nn.functional.linear(hidden, seg.lora_B) * seg.scaling


def _groups(segments: list[LoraSegment]) -> list[list[LoraSegment]]:
    """Segments keyed by what a batched matmul needs to share: rank, rows, dtype and device."""
    groups: dict[tuple, list[LoraSegment]] = defaultdict(list)
    for seg in segments:
        key = (seg.lora_A.shape[0], seg.rows, seg.lora_A.dtype, seg.lora_A.device)
        groups[key].append(seg)
    return list(groups.values())


def _group_deltas(
    x: torch.Tensor,
    views: dict[tuple[int, int], torch.Tensor],
    group: list[LoraSegment],
    out_features: int,
) -> list[tuple[int, torch.Tensor]]:
    """Deltas of same-shape segments with two ``bmm``; one block when the rows are contiguous."""
    k, rows = len(group), group[0].rows
    tail = x.shape[1:-1]
    contiguous = _contiguous(group)
    if contiguous and all(seg.dropout is None for seg in group):
        x_k = views[(group[0].start, group[-1].end)].reshape(k, -1, x.shape[-1])  # a view, no copy
    elif contiguous:
        pieces = views[(group[0].start, group[-1].end)].split(rows)
        x_k = torch.stack([p if s.dropout is None else s.dropout(p) for s, p in zip(group, pieces)])
    else:
        pieces = [views[(s.start, s.end)] for s in group]
        x_k = torch.stack([p if s.dropout is None else s.dropout(p) for s, p in zip(group, pieces)])
    x_k = x_k.reshape(k, -1, x.shape[-1])
    scalings = torch.tensor([seg.scaling for seg in group], dtype=x.dtype, device=x.device)
    delta_k = _GroupedLora.apply(
        x_k, scalings, *(s.lora_A for s in group), *(s.lora_B for s in group)
    )
    if contiguous:
        return [(group[0].start, delta_k.reshape(k * rows, *tail, out_features))]
    return [
        (seg.start, d.reshape(rows, *tail, out_features))
        for seg, d in zip(group, delta_k.unbind(0))
    ]


class _GroupedLora(torch.autograd.Function):
    """``scaling_k * x_k @ A_k.T @ B_k.T`` for k same-shape adapters, as ONE autograd node.

    Stacking the adapters with autograd-tracked ``torch.stack`` costs a stack, an unbind and
    several graph nodes per layer and call; with many small tenants those dominate. Here the
    stacking is done without autograd and the backward computes every adapter's gradients with
    three batched matmuls.
    """

    @staticmethod
    def forward(ctx, x_k, scalings, *weights):
        k = len(weights) // 2
        a_k = torch.stack(weights[:k])  # [k, r, in]
        b_k = torch.stack(weights[k:])  # [k, out, r]
        hidden = torch.bmm(x_k, a_k.transpose(1, 2))  # [k, n, r]
        ctx.save_for_backward(x_k, scalings, a_k, b_k, hidden)
        return torch.bmm(hidden, b_k.transpose(1, 2)) * scalings.view(-1, 1, 1)

    @staticmethod
    def backward(ctx, grad_out):
        x_k, scalings, a_k, b_k, hidden = ctx.saved_tensors
        grad_scaled = grad_out * scalings.view(-1, 1, 1)  # [k, n, out]
        grad_hidden = torch.bmm(grad_scaled, b_k)  # [k, n, r]
        grad_b = torch.bmm(grad_scaled.transpose(1, 2), hidden)  # [k, out, r]
        grad_a = torch.bmm(grad_hidden.transpose(1, 2), x_k)  # [k, r, in]
        grad_x = torch.bmm(grad_hidden, a_k) if ctx.needs_input_grad[0] else None
        return (grad_x, None, *grad_a.unbind(0), *grad_b.unbind(0))


def _assemble(
    x: torch.Tensor, blocks: list[tuple[int, torch.Tensor]], out_features: int
) -> torch.Tensor:
    """Concatenate row blocks sorted by start, with zero rows in the gaps."""
    rows = x.shape[0]
    pieces: list[torch.Tensor] = []
    cursor = 0
    for start, delta in blocks:
        if start > cursor:
            pieces.append(x.new_zeros((start - cursor, *x.shape[1:-1], out_features)))
        pieces.append(delta)
        cursor = start + delta.shape[0]
    if cursor < rows:
        pieces.append(x.new_zeros((rows - cursor, *x.shape[1:-1], out_features)))
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)


def segmented_lora(x: torch.Tensor, segments: list[LoraSegment], out_features: int) -> torch.Tensor:
    """The multi-LoRA operation on the best path for ``x``: the Triton kernels for CUDA tensors
    when triton is installed (``TWINKLE_LORA_KERNEL=torch`` forces the torch path), else the torch
    reference. Both have the same semantics and gradients."""
    if x.is_cuda and _kernel_choice() == "triton":
        from twinkle.model.lora.triton_ops import segmented_lora_triton, triton_available

        if triton_available():
            return segmented_lora_triton(x, segments, out_features)
    return segmented_lora_reference(x, segments, out_features)


def _kernel_choice() -> str:
    import os

    return os.environ.get("TWINKLE_LORA_KERNEL", "triton")
