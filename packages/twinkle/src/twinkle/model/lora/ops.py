"""The multi-LoRA linear operation: rows grouped in segments, each segment with its own adapter.

``y[s:e] = scaling_k * dropout_k(x[s:e]) @ A_k.T @ B_k.T`` for each segment ``k`` covering rows
``s:e``; rows outside every segment get zero. Ranks may differ per segment: nothing is padded to the
largest rank. ``segmented_lora`` picks the implementation: the Triton kernels for CUDA tensors
(``triton_ops``), else the torch one (``torch_kernel``: one autograd node per layer call, batched
GEMMs over same-shape segments). ``_segmented_lora_loop`` is the plain definition both are tested
against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from twinkle.model.lora.torch_kernel import Plan, SegmentedLora, weight_inputs


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
    x: torch.Tensor,
    segments: list[LoraSegment],
    out_features: int,
    plan: Plan | None = None,
) -> torch.Tensor:
    """LoRA deltas for every row of ``x`` ([rows, ..., in]) by segment; a differentiable torch path.

    Args:
        x: Input activations; dim 0 indexes rows (sequences).
        segments: Non-overlapping segments sorted by ``start``.
        out_features: Output width, for the zero rows between segments.
        plan: ``build_plan(segments, x)``, when the caller keeps one; built here otherwise.

    Returns:
        A tensor shaped like ``x`` with the last dim ``out_features``.
    """
    plan = plan or build_plan(segments, x)
    out_shape = (*x.shape[:-1], out_features)
    if not plan.groups:
        return x.new_zeros(out_shape)
    masks = _dropout_masks(x, plan.segments) if plan.dropout else (None,) * len(plan.segments)
    direct, inputs = weight_inputs(plan.weights, x.device)
    out = SegmentedLora.apply(x.reshape(-1, x.shape[-1]), plan, masks, direct, *inputs)
    return out.reshape(out_shape)


def build_plan(segments: list[LoraSegment], x: torch.Tensor) -> Plan:
    """How the torch path runs ``segments`` over inputs shaped like ``x``.

    It depends only on the segments and ``x``'s leading shape, dtype and device, so a layer builds
    it once per routing layout and reuses it (see ``MultiLoraLinear``).
    """
    tokens_per_row = math.prod(x.shape[1:-1])
    active = [seg for seg in segments if seg.end > seg.start] if tokens_per_row else []
    return Plan.build(active, x.shape[0], tokens_per_row, x.dtype, x.device)


def _segmented_lora_loop(
    x: torch.Tensor, segments: list[LoraSegment], out_features: int
) -> torch.Tensor:
    """The same op, one segment at a time with plain autograd: the definition the fused paths
    are tested against."""
    pieces, cursor = [], 0
    for seg in segments:
        if seg.start > cursor:
            pieces.append(x.new_zeros((seg.start - cursor, *x.shape[1:-1], out_features)))
        part = x[seg.start : seg.end]
        if seg.dropout is not None:
            part = seg.dropout(part)
        hidden = torch.nn.functional.linear(part, seg.lora_A)
        pieces.append(torch.nn.functional.linear(hidden, seg.lora_B) * seg.scaling)
        cursor = seg.end
    if cursor < x.shape[0]:
        pieces.append(x.new_zeros((x.shape[0] - cursor, *x.shape[1:-1], out_features)))
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)


def _dropout_masks(x: torch.Tensor, segments) -> tuple[torch.Tensor | None, ...]:
    """Per segment, its dropout as a multiplicative mask over its rows (None without dropout).

    Dropout is elementwise ``x * mask``; drawing it on ones of the segment's shape consumes the
    random stream exactly as ``dropout(x[s:e])`` would, so seeded runs match the loop.
    """
    masks = []
    for seg in segments:
        if seg.dropout is None:
            masks.append(None)
        else:
            ones = x.new_ones((seg.rows, *x.shape[1:]))
            masks.append(seg.dropout(ones).reshape(-1, x.shape[-1]))
    return tuple(masks)


def segmented_lora(
    x: torch.Tensor,
    segments: list[LoraSegment],
    out_features: int,
    plan: Plan | None = None,
) -> torch.Tensor:
    """The multi-LoRA operation on the best path for ``x``: the Triton kernels for CUDA tensors
    when triton is installed (``TWINKLE_LORA_KERNEL=torch`` forces the torch path), else the torch
    reference. Both have the same semantics and gradients."""
    if x.is_cuda and _kernel_choice() == "triton":
        from twinkle.model.lora.triton_ops import segmented_lora_triton, triton_available

        if triton_available():
            return segmented_lora_triton(x, segments, out_features)
    return segmented_lora_reference(x, segments, out_features, plan)


def _kernel_choice() -> str:
    import os

    return os.environ.get("TWINKLE_LORA_KERNEL", "triton")
