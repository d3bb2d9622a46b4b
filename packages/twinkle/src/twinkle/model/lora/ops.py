"""The multi-LoRA linear operation: rows grouped in segments, each segment with its own adapter.

``y[s:e] = scaling_k * dropout_k(x[s:e]) @ A_k.T @ B_k.T`` for each segment ``k`` covering rows
``s:e``; rows outside every segment get zero. Ranks may differ per segment: nothing is padded to the
largest rank. ``segmented_lora`` dispatches to a kernel by its explicit ``kernel`` argument: the
Triton one (``triton_kernel``) or the torch one (``torch_kernel``: one autograd node per layer
call, batched GEMMs over same-shape segments). ``_segmented_lora_loop`` is the plain definition
both are tested against.
"""

from __future__ import annotations

import torch

from twinkle.model.lora.segments import LoraSegment
from twinkle.model.lora.torch_kernel import Plan, build_plan, segmented_lora_reference
from twinkle.model.lora.triton_kernel import segmented_lora_triton, triton_available

KERNELS = ("auto", "torch", "triton")


def segmented_lora(
    x: torch.Tensor,
    segments: list[LoraSegment],
    out_features: int,
    plan: Plan | None = None,
    *,
    kernel: str = "auto",
    anchor: torch.Tensor | None = None,
) -> torch.Tensor:
    """The multi-LoRA operation on the kernel ``kernel`` names; both have the same semantics and
    gradients.

    Args:
        x: Input activations ``[rows, ..., in]``; dim 0 indexes rows (sequences).
        segments: Non-overlapping segments sorted by ``start``.
        out_features: Output width.
        plan: The torch kernel's ``build_plan(segments, x, out_features)``, when the caller keeps
            one (the Triton kernel builds its own per call).
        kernel: ``auto``: Triton for CUDA tensors when triton imports, else torch. ``torch``:
            always torch. ``triton``: Triton for CUDA tensors (an error without triton), torch
            for CPU ones.
        anchor: A direct pass's anchor on ``x``'s device (``direct_grads``): backward adds the
            weight gradients to their ``.grad`` itself. None: autograd accumulates them.

    Returns:
        A tensor shaped like ``x`` with the last dim ``out_features``.

    Raises:
        ValueError: An unknown ``kernel``, or segments that do not fit ``x``.
        RuntimeError: ``kernel="triton"`` for a CUDA tensor without triton installed.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if x.is_cuda and (kernel == "triton" or (kernel == "auto" and triton_available())):
        return segmented_lora_triton(x, segments, out_features, anchor=anchor)
    return segmented_lora_reference(x, segments, out_features, plan, anchor=anchor)


def _segmented_lora_loop(
    x: torch.Tensor, segments: list[LoraSegment], out_features: int
) -> torch.Tensor:
    """The same op, one segment at a time with plain autograd: the definition the kernels are
    tested against."""
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


__all__ = [
    "KERNELS",
    "LoraSegment",
    "Plan",
    "build_plan",
    "segmented_lora",
    "segmented_lora_reference",
]
