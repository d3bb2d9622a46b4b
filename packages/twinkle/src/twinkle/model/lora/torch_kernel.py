"""The torch kernel of the segmented multi-LoRA op: ONE autograd node per layer call.

With many small tenants the cost of a multi-LoRA layer is the number of small GEMM calls and
autograd nodes, not their arithmetic. So:

* the layer's whole delta is one autograd node (``SegmentedLora``) whose backward computes every
  adapter's gradients itself (no per-segment linear/mul/split/cat nodes);
* consecutive segments with the same rank and row count run as one ``bmm`` per stage (2 forward,
  4 backward); a lone segment uses ``mm``; ranks are never padded;
* every GEMM keeps torch's thread count (one thread for a layer call of small lone GEMMs, an
  earlier rule, was slower on the fused step);
* a segment's scaling rides in the GEMMs' ``alpha`` (``addmm``/``baddbmm``) instead of a multiply
  by a Python float, which costs a scalar conversion and a kernel per call; only a group whose
  segments have different scalings multiplies by a ``[k, 1, 1]`` tensor;
* backward unpacks four saved tensors per group (a group saves its stacked weights, not each
  segment's pair) and splits stacked gradients with one ``unbind``;
* without dropout (the usual case) a group's rows are a plain view: no mask bookkeeping;
* given an ``anchor`` (a direct pass, see ``direct_grads``) the weights are not autograd inputs
  at all: backward adds their gradients to their ``.grad`` with ONE ``_foreach_add_`` per layer
  call, instead of autograd running an edge and an ``AccumulateGrad`` node per weight (16 per
  layer call with 8 tenants).

Dropout is applied as each segment's multiplicative mask (``segments.dropout_masks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from twinkle.model.lora import direct_grads
from twinkle.model.lora.segments import LoraSegment, dropout_masks, validate_segments


def segmented_lora_reference(
    x: torch.Tensor,
    segments: list[LoraSegment],
    out_features: int,
    plan: Plan | None = None,
    *,
    anchor: torch.Tensor | None = None,
) -> torch.Tensor:
    """LoRA deltas for every row of ``x`` ([rows, ..., in]) by segment; the torch kernel.

    Args:
        x: Input activations; dim 0 indexes rows (sequences).
        segments: Non-overlapping segments sorted by ``start``.
        out_features: Output width, for the zero rows between segments.
        plan: ``build_plan(segments, x, out_features)``, when the caller keeps one; built (and
            the segments checked) here otherwise.
        anchor: A direct pass's anchor on ``x``'s device (``direct_grads``): backward then adds
            the weight gradients to their ``.grad`` itself. None: autograd accumulates them.

    Returns:
        A tensor shaped like ``x`` with the last dim ``out_features``.

    Raises:
        ValueError: Segments out of order, overlapping, out of range, or with mis-shaped weights
            (checked when the plan is built).
    """
    plan = plan or build_plan(segments, x, out_features)
    out_shape = (*x.shape[:-1], out_features)
    if not plan.groups:
        return x.new_zeros(out_shape)
    masks = dropout_masks(x, plan.segments) if plan.dropout else (None,) * len(plan.segments)
    direct, inputs = direct_grads.weight_inputs(plan.weights, anchor)
    out = SegmentedLora.apply(x.reshape(-1, x.shape[-1]), plan, masks, direct, *inputs)
    return out.reshape(out_shape)


def build_plan(segments: list[LoraSegment], x: torch.Tensor, out_features: int) -> Plan:
    """How the torch kernel runs ``segments`` over inputs shaped like ``x``, after checking them.

    It depends only on the segments and ``x``'s leading shape, dtype and device, so a layer builds
    it once per routing layout and reuses it (see ``MultiLoraLinear``).

    Raises:
        ValueError: See :func:`~twinkle.model.lora.segments.validate_segments`.
    """
    validate_segments(x, segments, out_features)
    tokens_per_row = math.prod(x.shape[1:-1])
    active = [seg for seg in segments if seg.end > seg.start] if tokens_per_row else []
    return Plan.build(active, x.shape[0], tokens_per_row, x.dtype, x.device)


@dataclass(frozen=True)
class Group:
    """Consecutive segments ``first:first + k`` of one rank and one token count, covering tokens
    ``start:end`` of the flattened input; ``k > 1`` runs as one ``bmm`` per stage."""

    first: int
    k: int
    start: int
    end: int
    scalings: tuple[float, ...]
    # [k, 1, 1] when the k scalings differ; else None and the GEMMs' alpha carries scalings[0]
    scaling: torch.Tensor | None = None


@dataclass(frozen=True)
class Plan:
    """What ``SegmentedLora`` runs for one routing layout: its non-empty segments in groups."""

    segments: tuple[LoraSegment, ...]  # the non-empty ones, in order
    groups: tuple[Group, ...]
    covers_all: bool  # no token outside every segment: outputs need no zero fill
    weights: tuple[torch.Tensor, ...] = ()  # A_0, B_0, A_1, B_1, ... of ``segments``
    dropout: bool = False  # some segment has dropout (else the op gets no masks to draw)

    @staticmethod
    def build(
        segments: list[LoraSegment],
        rows: int,
        tokens_per_row: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> Plan:
        runs: list[list[int]] = []
        for i, seg in enumerate(segments):
            prev = segments[i - 1] if i else None
            if (
                prev is not None
                and prev.end == seg.start
                and prev.rows == seg.rows
                and prev.lora_A.shape == seg.lora_A.shape
                and prev.lora_A.dtype == seg.lora_A.dtype
            ):
                runs[-1].append(i)
            else:
                runs.append([i])
        groups = []
        for run in runs:
            first = segments[run[0]]
            scalings = tuple(segments[i].scaling for i in run)
            groups.append(
                Group(
                    first=run[0],
                    k=len(run),
                    start=first.start * tokens_per_row,
                    end=segments[run[-1]].end * tokens_per_row,
                    scalings=scalings,
                    scaling=(
                        torch.tensor(scalings, dtype=dtype, device=device).view(-1, 1, 1)
                        if len(set(scalings)) > 1
                        else None
                    ),
                )
            )
        covered = sum(seg.rows for seg in segments)
        return Plan(
            tuple(segments),
            tuple(groups),
            covers_all=covered == rows,
            weights=tuple(w for seg in segments for w in (seg.lora_A, seg.lora_B)),
            dropout=any(seg.dropout is not None for seg in segments),
        )


class SegmentedLora(torch.autograd.Function):
    """``scaling * dropout(x) @ A.T @ B.T`` per segment, for every segment, as one autograd node.

    ``x`` is the flattened input ``[tokens, in]``; the weights are ``plan.weights`` (``A_0, B_0,
    A_1, B_1, ...``); ``masks`` holds each segment's dropout mask or None, and is all None unless
    ``plan.dropout``. ``inputs`` are the weights again, so that autograd accumulates their
    gradients; or, with ``direct``, only a direct pass's anchor (``direct_grads``), and backward
    adds the weight gradients to the weights' ``.grad`` itself.
    """

    @staticmethod
    def forward(ctx, x, plan: Plan, masks, direct: bool, *inputs):
        weights = plan.weights
        out_features = weights[1].shape[0]
        alloc = x.new_empty if plan.covers_all else x.new_zeros
        out = alloc((x.shape[0], out_features))
        saved: list[torch.Tensor] = []
        for group in plan.groups:
            x_g = _group_input(x, group, masks) if plan.dropout else x[group.start : group.end]
            out_g = out[group.start : group.end]
            if group.k == 1:
                # The scaling rides in the GEMM's alpha: a separate multiply by a Python
                # float costs a scalar-tensor conversion and a kernel.
                a, b = weights[2 * group.first], weights[2 * group.first + 1]
                hidden = torch.mm(x_g, a.t())  # unscaled
                torch.addmm(out_g, hidden, b.t(), beta=0, alpha=group.scalings[0], out=out_g)
                saved += [x_g, hidden, a, b]
            else:
                a_k, b_k = _stacked(weights, group)
                x_k = x_g.view(group.k, -1, x.shape[1])
                out_k = out_g.view(group.k, -1, out_features)
                hidden = torch.bmm(x_k, a_k.transpose(1, 2))
                if group.scaling is None:  # one scaling for the group: alpha, hidden unscaled
                    s = group.scalings[0]
                    torch.baddbmm(out_k, hidden, b_k.transpose(1, 2), beta=0, alpha=s, out=out_k)
                else:  # hidden carries each segment's scaling
                    torch.bmm(hidden.mul_(group.scaling), b_k.transpose(1, 2), out=out_k)
                saved += [x_g, hidden, a_k, b_k]
        ctx.plan, ctx.masks, ctx.in_features, ctx.direct = plan, masks, x.shape[1], direct
        # Four tensors per group; a group of k > 1 saves its stacked weights, not its k pairs
        # (each saved tensor costs a pack and an unpack).
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        plan, masks = ctx.plan, ctx.masks
        saved = iter(ctx.saved_tensors)
        grad_out = grad_out.contiguous()
        need_x = ctx.needs_input_grad[0]
        grad_x = None
        if need_x:
            alloc = grad_out.new_empty if plan.covers_all else grad_out.new_zeros
            grad_x = alloc((grad_out.shape[0], ctx.in_features))
        grads: list[torch.Tensor | None] = [None] * len(plan.weights)
        zero = grad_out.new_zeros(())
        for group in plan.groups:
            g = grad_out[group.start : group.end]
            grad_x_g = grad_x[group.start : group.end] if grad_x is not None else None
            if group.k == 1:
                x_g, hidden, a, b = next(saved), next(saved), next(saved), next(saved)
                i = 2 * group.first  # hidden is unscaled
                s = group.scalings[0]
                # beta=0: the 0-dim ``zero`` only gives addmm an input to ignore.
                grads[i + 1] = torch.addmm(zero, g.t(), hidden, beta=0, alpha=s)  # [out, r]
                grad_hidden = torch.mm(g, b)  # [n, r], unscaled
                grads[i] = torch.addmm(zero, grad_hidden.t(), x_g, beta=0, alpha=s)  # [r, in]
                if grad_x_g is not None:
                    torch.addmm(grad_x_g, grad_hidden, a, beta=0, alpha=s, out=grad_x_g)
            else:
                x_g, hidden, a_k, b_k = next(saved), next(saved), next(saved), next(saved)
                g_k = g.view(group.k, -1, g.shape[1])
                x_k = x_g.view(group.k, -1, x_g.shape[1])
                grad_hidden = torch.bmm(g_k, b_k)  # [k, n, r]
                if group.scaling is None:  # hidden and grad_hidden unscaled: alpha scales
                    s = group.scalings[0]
                    grad_b = torch.baddbmm(zero, g_k.transpose(1, 2), hidden, beta=0, alpha=s)
                    grad_a = torch.baddbmm(zero, grad_hidden.transpose(1, 2), x_k, beta=0, alpha=s)
                else:  # hidden was scaled in the forward
                    s = 1.0
                    grad_b = torch.bmm(g_k.transpose(1, 2), hidden)  # [k, out, r]
                    grad_hidden.mul_(group.scaling)
                    grad_a = torch.bmm(grad_hidden.transpose(1, 2), x_k)  # [k, r, in]
                first = 2 * group.first
                grads[first : first + 2 * group.k : 2] = grad_a.unbind(0)
                grads[first + 1 : first + 2 * group.k : 2] = grad_b.unbind(0)
                if grad_x_g is not None:
                    out_k = grad_x_g.view(group.k, -1, a_k.shape[2])
                    torch.baddbmm(out_k, grad_hidden, a_k, beta=0, alpha=s, out=out_k)
            if grad_x_g is not None and plan.dropout:
                _apply_masks_to_grad(grad_x_g, group, masks)
        if ctx.direct:
            direct_grads.add_weight_grads(plan.weights, grads)
            return (grad_x, None, None, None, None)  # None: the anchor gets no gradient
        return (grad_x, None, None, None, *grads)


def _stacked(weights, group: Group) -> tuple[torch.Tensor, torch.Tensor]:
    first, k = group.first, group.k
    a_k = torch.stack([weights[2 * (first + j)] for j in range(k)])  # [k, r, in]
    b_k = torch.stack([weights[2 * (first + j) + 1] for j in range(k)])  # [k, out, r]
    return a_k, b_k


def _group_input(x: torch.Tensor, group: Group, masks) -> torch.Tensor:
    """The group's rows of ``x``, with each segment's dropout mask applied (a view without)."""
    x_g = x[group.start : group.end]
    group_masks = masks[group.first : group.first + group.k]
    if all(m is None for m in group_masks):
        return x_g
    pieces = x_g.chunk(group.k)
    return torch.cat([p if m is None else p * m for p, m in zip(pieces, group_masks)])


def _apply_masks_to_grad(grad_x_g: torch.Tensor, group: Group, masks) -> None:
    group_masks = masks[group.first : group.first + group.k]
    if all(m is None for m in group_masks):
        return
    for p, m in zip(grad_x_g.chunk(group.k), group_masks):
        if m is not None:
            p.mul_(m)
