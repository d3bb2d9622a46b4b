"""LoRA deltas on tensor-parallel megatron linears (tp > 1).

Layout. Every rank keeps each tenant's full A and B (PEFT shapes, identical on all ranks), and
uses only the part megatron's sharding of the base linear calls for:

* column-parallel (``linear_qkv``, ``linear_fc1``; output rows split): ``A`` whole, ``B`` this
  rank's rows. ``h = x A^T`` is the same on every rank; ``copy_to_tensor_model_parallel_region``
  on ``h`` all-reduces its gradient in backward, so ``dA`` and the LoRA path's ``dx`` are whole
  on every rank (the base layer all-reduces only its own path's ``dx``).
* row-parallel (``linear_proj``, ``linear_fc2``; input columns split): ``A`` this rank's
  columns, ``B`` whole. ``h = x_shard A_shard^T`` is a partial sum; ``reduce_from_...`` all-reduces
  it in forward, then ``h B^T`` adds onto the base layer's (already reduced) output.

The extra communication is therefore one all-reduce of a ``[tokens, r]`` tensor per adapted
linear (backward for column, forward for row): ``r`` is 8-64 against a hidden size in the
thousands, so it is small next to the base layer's own ``[tokens, hidden]`` all-reduce. Fusing it
into the base layer's all-reduce would save the latency, not the bytes, and needs megatron's
linear internals; not done.

Gradients of the sliced weight (``B`` of column, ``A`` of row) are all-gathered in backward
(:class:`_Shard`), so every rank's ``.grad`` is the whole gradient: clipping and the saved
adapter are identical on every rank, and rank 0 writes the checkpoint alone. The Adam moments
are not replicated: each rank keeps its chunk of them (:mod:`~twinkle.model.megatron._tp_optim`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from twinkle.model.lora.segments import LoraSegment


class _Shard(torch.autograd.Function):
    """``full.chunk(tp, dim)[rank]``; backward all-gathers the slices' gradients into a whole
    one (the same on every rank)."""

    @staticmethod
    def forward(ctx, full: torch.Tensor, dim: int) -> torch.Tensor:
        from megatron.core import parallel_state as ps

        ctx.dim = dim
        tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
        return full.chunk(tp, dim)[rank].contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        from megatron.core import parallel_state as ps

        group = ps.get_tensor_model_parallel_group()
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, grad.contiguous(), group=group)
        return torch.cat(parts, dim=ctx.dim), None


def vocab_rows(full: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a whole ``[vocab, r]`` tensor (an ``lm_head`` adapter's ``B``, as the
    vocab-parallel output layer splits the vocabulary); its gradient is gathered whole."""
    return _Shard.apply(full, 0)


def _rows_delta(
    xb: torch.Tensor, segments: list[LoraSegment], out_features: int, one_segment
) -> torch.Tensor:
    """The delta of every row of ``xb`` ([rows, seq, in]), zero for rows without an adapter."""
    pieces, at = [], 0
    for seg in segments:
        if seg.start > at:
            pieces.append(xb.new_zeros(seg.start - at, *xb.shape[1:-1], out_features))
        x = xb[seg.start : seg.end]
        if seg.dropout is not None:
            x = seg.dropout(x)
        pieces.append(one_segment(x, seg) * seg.scaling)
        at = seg.end
    if at < xb.shape[0]:
        pieces.append(xb.new_zeros(xb.shape[0] - at, *xb.shape[1:-1], out_features))
    return torch.cat(pieces, dim=0)


def column_delta(xb: torch.Tensor, segments: list[LoraSegment], out_full: int) -> torch.Tensor:
    """This rank's output slice of the LoRA delta of a column-parallel part (``xb`` whole)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

    out_local = out_full // ps.get_tensor_model_parallel_world_size()

    def one(x: torch.Tensor, seg: LoraSegment) -> torch.Tensor:
        h = copy_to_tensor_model_parallel_region(x @ seg.lora_A.t())
        return h @ _Shard.apply(seg.lora_B, 0).t()

    return _rows_delta(xb, segments, out_local, one)


def row_delta(xb: torch.Tensor, segments: list[LoraSegment], out_full: int) -> torch.Tensor:
    """The whole LoRA delta of a row-parallel part from this rank's input slice ``xb``."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    def one(x: torch.Tensor, seg: LoraSegment) -> torch.Tensor:
        h = reduce_from_tensor_model_parallel_region(x @ _Shard.apply(seg.lora_A, 1).t())
        return h @ seg.lora_B.t()

    return _rows_delta(xb, segments, out_full, one)
