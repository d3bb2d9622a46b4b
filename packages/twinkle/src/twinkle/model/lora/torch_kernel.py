"""The torch implementation of the segmented multi-LoRA op: ONE autograd node per layer call.

With many small tenants the cost of a multi-LoRA layer is the number of small GEMM calls and
autograd nodes, not their arithmetic. So:

* the layer's whole delta is one autograd node (``SegmentedLora``) whose backward computes every
  adapter's gradients itself (no per-segment linear/mul/split/cat nodes);
* consecutive segments with the same rank and row count run as one ``bmm`` per stage (2 forward,
  4 backward); a lone segment uses ``mm``; ranks are never padded;
* every GEMM keeps torch's thread count: dropping to one thread for a layer call of small lone
  GEMMs (an earlier rule) made the tiny model's fused mixed-rank step 3% slower, measured in one
  process against the same step on two threads;
* a lone segment's scaling rides in the GEMMs' ``alpha`` (``addmm``) instead of a multiply by a
  Python float, which costs a scalar conversion and a kernel per call;
* without dropout (the usual case) a group's rows are a plain view: no mask bookkeeping.

Dropout is applied as each segment's multiplicative mask (``ops._dropout_masks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from twinkle.model.lora.ops import LoraSegment


@dataclass(frozen=True)
class Group:
    """Consecutive segments ``first:first + k`` of one rank and one token count, covering tokens
    ``start:end`` of the flattened input; ``k > 1`` runs as one ``bmm`` per stage."""

    first: int
    k: int
    start: int
    end: int
    scalings: tuple[float, ...]
    scaling: torch.Tensor | None = None  # [k, 1, 1] for k > 1


@dataclass(frozen=True)
class Plan:
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
                        if len(run) > 1
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

    ``x`` is the flattened input ``[tokens, in]``; ``weights`` are ``A_0, B_0, A_1, B_1, ...``;
    ``masks`` holds each segment's dropout mask or None, and is all None unless ``plan.dropout``.
    """

    @staticmethod
    def forward(ctx, x, plan: Plan, masks, *weights):
        out_features = weights[1].shape[0]
        alloc = x.new_empty if plan.covers_all else x.new_zeros
        out = alloc((x.shape[0], out_features))
        saved: list[torch.Tensor] = []
        for group in plan.groups:
            x_g = _group_input(x, group, masks) if plan.dropout else x[group.start : group.end]
            out_g = out[group.start : group.end]
            if group.k == 1:
                # The scaling rides in the GEMM's alpha: a separate multiply by a Python
                # float costs a scalar-tensor conversion and a kernel (~3 us each).
                a, b = weights[2 * group.first], weights[2 * group.first + 1]
                hidden = torch.mm(x_g, a.t())  # unscaled
                torch.addmm(out_g, hidden, b.t(), beta=0, alpha=group.scalings[0], out=out_g)
                saved += [x_g, hidden]
            else:
                a_k, b_k = _stacked(weights, group)
                x_k = x_g.view(group.k, -1, x.shape[1])
                hidden = torch.bmm(x_k, a_k.transpose(1, 2)).mul_(group.scaling)
                torch.bmm(hidden, b_k.transpose(1, 2), out=out_g.view(group.k, -1, out_features))
                saved += [x_g, hidden, a_k, b_k]
        ctx.plan, ctx.masks = plan, masks
        ctx.save_for_backward(*saved, *weights)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        plan, masks = ctx.plan, ctx.masks
        n_saved = sum(2 if group.k == 1 else 4 for group in plan.groups)
        everything = ctx.saved_tensors
        saved, weights = iter(everything[:n_saved]), everything[n_saved:]
        grad_out = grad_out.contiguous()
        need_x = ctx.needs_input_grad[0]
        grad_x = None
        if need_x:
            alloc = grad_out.new_empty if plan.covers_all else grad_out.new_zeros
            grad_x = alloc((grad_out.shape[0], weights[0].shape[1]))
        grads: list[torch.Tensor | None] = [None] * len(weights)
        zero = grad_out.new_zeros(())
        for group in plan.groups:
            g = grad_out[group.start : group.end]
            grad_x_g = grad_x[group.start : group.end] if grad_x is not None else None
            if group.k == 1:
                x_g, hidden = next(saved), next(saved)  # hidden is unscaled
                i = 2 * group.first
                a, b = weights[i], weights[i + 1]
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
                grad_b = torch.bmm(g_k.transpose(1, 2), hidden)  # [k, out, r]
                grad_hidden = torch.bmm(g_k, b_k).mul_(group.scaling)  # [k, n, r]
                grad_a = torch.bmm(grad_hidden.transpose(1, 2), x_k)  # [k, r, in]
                for j in range(group.k):
                    grads[2 * (group.first + j)] = grad_a[j]
                    grads[2 * (group.first + j) + 1] = grad_b[j]
                if grad_x_g is not None:
                    out_k = grad_x_g.view(group.k, -1, a_k.shape[2])
                    torch.bmm(grad_hidden, a_k, out=out_k)
            if grad_x_g is not None and plan.dropout:
                _apply_masks_to_grad(grad_x_g, group, masks)
        return (grad_x, None, None, *grads)


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
