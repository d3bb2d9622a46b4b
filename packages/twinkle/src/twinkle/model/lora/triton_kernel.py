"""The Triton kernel of the segmented multi-LoRA op (``segmented_lora_reference``'s semantics).

``segmented_lora_triton(x, segments, out_features)`` returns, for ``x`` shaped
``[rows, ..., in]``, ``scaling_k * dropout_k(x[s:e]) @ A_k.T @ B_k.T`` on the rows ``s:e`` of each
segment ``k`` and zero on rows outside every segment; ranks differ per segment and nothing is
padded to the largest rank.

Layout (built per call, see ``_Plan``):

* ``x`` is flattened to tokens ``[N, in]``; segment ``k`` covers tokens ``[s*T, e*T)`` with ``T``
  the product of the middle dims.
* ``A_flat``: every ``A_k`` ([r_k, in], row-major) one after another; ``a_off[k]`` is its first
  element.
* ``B_flat``: every ``B_k`` ([out, r_k], row-major) one after another; ``b_off[k]``.
* ``h_flat`` (fp32): the shrink result of segment ``k`` as a row-major ``[n_k, r_k]`` block at
  ``h_off[k]``, so the intermediate is not padded either.
* Token blocks: each segment is cut into blocks of ``BLOCK_M`` tokens; block ``b`` carries its
  segment id and first token. Blocks never straddle segments, and gap rows get no block (they stay
  zero).

Kernels (both accumulate in fp32):

* ``shrink``: grid (token blocks, rank blocks).
  ``out[t, j] = scale? * sum_k inp[t, k] * W_k[j, k]`` written into a packed per-segment buffer.
  Forward ``h = x @ A_k.T``; backward ``dh = s_k dy @ B_k``.
* ``expand``: grid (token blocks, output blocks).
  ``out[t, n] = scale? * sum_j h[t, j] * W_k[j, n]`` read from a packed buffer into a dense
  output. Forward ``y = s_k h @ B_k.T``; backward ``dx = dh @ A_k``.

The weight gradients (``dA_k = dh_k.T @ x_k``, ``dB_k = s_k dy_k.T @ h_k``) are one torch matmul
per segment on views of the saved buffers (cuBLAS, fp32 accumulation), not Triton. Given an
``anchor`` (a direct pass, see ``direct_grads``) they are added to the weights' ``.grad`` with one
``_foreach_add_`` instead of going back through autograd, exactly as on the torch kernel.

Dropout is applied in torch, per segment, before the kernels, with the masks the torch kernel
draws (``segments.dropout_masks``, in segment order, so a seeded run draws the same masks);
autograd keeps the mask through torch, so the custom function sees already-dropped activations.

Kernels are decorated lazily, on first use, for the ``TRITON_INTERPRET`` setting, which is read
once per process at that first launch (``twinkle.env.triton_interpret``): CPU tensors run through
the Triton interpreter (``TRITON_INTERPRET=1``), CUDA tensors through compiled kernels. This module imports without Triton; ``segmented_lora_triton`` then raises
``RuntimeError``.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from twinkle.env import triton_interpret
from twinkle.model.lora import direct_grads
from twinkle.model.lora.segments import LoraSegment, dropout_masks, validate_segments

try:  # pragma: no cover - depends on the environment
    import triton
    import triton.language as tl

    _TRITON_IMPORT_ERROR: BaseException | None = None
except Exception as exc:  # pragma: no cover - depends on the environment
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR = exc

__all__ = ["segmented_lora_triton", "triton_available"]


def triton_available() -> bool:
    """True when ``triton`` imports in this environment."""
    return triton is not None


if triton is not None:

    def _seg_shrink_kernel(
        inp_ptr,
        w_ptr,
        out_ptr,
        blk_seg_ptr,
        blk_tok_ptr,
        seg_tok_start_ptr,
        seg_tok_end_ptr,
        seg_rank_ptr,
        seg_w_off_ptr,
        seg_out_off_ptr,
        seg_scale_ptr,
        K,
        stride_inp,
        W_RANK_MAJOR: tl.constexpr,
        APPLY_SCALE: tl.constexpr,
        DOT_F32: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        """Packed ``out_k[t, j] = scale_k? * sum_k inp[t, k] * W_k(k, j)`` per token block.

        ``W_RANK_MAJOR``: ``W_k`` is stored ``[r_k, K]`` (A); else ``[K, r_k]`` (B).
        """
        pid_m = tl.program_id(0)
        pid_r = tl.program_id(1)
        seg = tl.load(blk_seg_ptr + pid_m)
        rank = tl.load(seg_rank_ptr + seg)
        if pid_r * BLOCK_R < rank:
            tok0 = tl.load(blk_tok_ptr + pid_m)
            tok_start = tl.load(seg_tok_start_ptr + seg)
            tok_end = tl.load(seg_tok_end_ptr + seg)
            w_off = tl.load(seg_w_off_ptr + seg)
            out_off = tl.load(seg_out_off_ptr + seg)
            offs_m = tok0 + tl.arange(0, BLOCK_M)
            m_mask = offs_m < tok_end
            offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
            r_mask = offs_r < rank
            acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_mask = offs_k < K
                a = tl.load(
                    inp_ptr + offs_m[:, None] * stride_inp + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                if W_RANK_MAJOR:
                    w_ptrs = w_ptr + w_off + offs_r[None, :] * K + offs_k[:, None]
                else:
                    w_ptrs = w_ptr + w_off + offs_k[:, None] * rank + offs_r[None, :]
                w = tl.load(w_ptrs, mask=k_mask[:, None] & r_mask[None, :], other=0.0)
                if DOT_F32:
                    acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
                else:
                    acc += tl.dot(a.to(w_ptr.dtype.element_ty), w)
            if APPLY_SCALE:
                acc = acc * tl.load(seg_scale_ptr + seg)
            out_ptrs = out_ptr + out_off + (offs_m - tok_start)[:, None] * rank + offs_r[None, :]
            tl.store(
                out_ptrs,
                acc.to(out_ptr.dtype.element_ty),
                mask=m_mask[:, None] & r_mask[None, :],
            )

    def _seg_expand_kernel(
        inp_ptr,
        w_ptr,
        out_ptr,
        blk_seg_ptr,
        blk_tok_ptr,
        seg_tok_start_ptr,
        seg_tok_end_ptr,
        seg_rank_ptr,
        seg_w_off_ptr,
        seg_inp_off_ptr,
        seg_scale_ptr,
        N,
        stride_out,
        W_RANK_MAJOR: tl.constexpr,
        APPLY_SCALE: tl.constexpr,
        DOT_F32: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_R: tl.constexpr,
    ):
        """Dense ``out[t, n] = scale_k? * sum_j inp_k[t, j] * W_k(j, n)`` from a packed input.

        ``W_RANK_MAJOR``: ``W_k`` is stored ``[r_k, N]`` (A); else ``[N, r_k]`` (B).
        """
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        seg = tl.load(blk_seg_ptr + pid_m)
        rank = tl.load(seg_rank_ptr + seg)
        tok0 = tl.load(blk_tok_ptr + pid_m)
        tok_start = tl.load(seg_tok_start_ptr + seg)
        tok_end = tl.load(seg_tok_end_ptr + seg)
        w_off = tl.load(seg_w_off_ptr + seg)
        inp_off = tl.load(seg_inp_off_ptr + seg)
        offs_m = tok0 + tl.arange(0, BLOCK_M)
        m_mask = offs_m < tok_end
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r0 in range(0, rank, BLOCK_R):
            offs_r = r0 + tl.arange(0, BLOCK_R)
            r_mask = offs_r < rank
            h = tl.load(
                inp_ptr + inp_off + (offs_m - tok_start)[:, None] * rank + offs_r[None, :],
                mask=m_mask[:, None] & r_mask[None, :],
                other=0.0,
            )
            if W_RANK_MAJOR:
                w_ptrs = w_ptr + w_off + offs_r[:, None] * N + offs_n[None, :]
            else:
                w_ptrs = w_ptr + w_off + offs_n[None, :] * rank + offs_r[:, None]
            w = tl.load(w_ptrs, mask=r_mask[:, None] & n_mask[None, :], other=0.0)
            if DOT_F32:
                acc += tl.dot(h.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(h.to(w_ptr.dtype.element_ty), w)
        if APPLY_SCALE:
            acc = acc * tl.load(seg_scale_ptr + seg)
        tl.store(
            out_ptr + offs_m[:, None] * stride_out + offs_n[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=m_mask[:, None] & n_mask[None, :],
        )


_KERNELS: dict[bool, tuple] = {}


def _kernels() -> tuple:
    """(shrink, expand) decorated for the interpreter setting (``twinkle.env.triton_interpret``)."""
    interpret = triton_interpret()
    if interpret not in _KERNELS:
        _KERNELS[interpret] = (triton.jit(_seg_shrink_kernel), triton.jit(_seg_expand_kernel))
    return _KERNELS[interpret]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass
class _Plan:
    """Per-call segment tables (host lists and one device copy)."""

    tok_start: list[int]
    tok_end: list[int]
    ranks: list[int]
    scales: list[float]
    a_off: list[int]
    b_off: list[int]
    h_off: list[int]
    h_total: int
    seg_meta: torch.Tensor  # int64 [6, S]: tok_start, tok_end, rank, a_off, b_off, h_off
    seg_scale: torch.Tensor  # fp32 [S]
    blocks: torch.Tensor  # int64 [2, nblocks]: segment id, first token
    n_blocks: int
    block_m: int
    block_r: int
    interpret: bool


def _build_plan(
    segs: Sequence[LoraSegment], tokens_per_row: int, in_f: int, out_f: int, device, interpret: bool
) -> _Plan:
    block_m = 64
    max_rank = max(int(s.lora_A.shape[0]) for s in segs)
    block_r = min(64, max(16, _next_pow2(max_rank)))
    tok_start, tok_end, ranks, scales, a_off, b_off, h_off = [], [], [], [], [], [], []
    blk_seg, blk_tok = [], []
    a_cur = b_cur = h_cur = 0
    for k, seg in enumerate(segs):
        r = int(seg.lora_A.shape[0])
        ts, te = seg.start * tokens_per_row, seg.end * tokens_per_row
        tok_start.append(ts)
        tok_end.append(te)
        ranks.append(r)
        scales.append(float(seg.scaling))
        a_off.append(a_cur)
        b_off.append(b_cur)
        h_off.append(h_cur)
        a_cur += r * in_f
        b_cur += out_f * r
        h_cur += (te - ts) * r
        for t in range(ts, te, block_m):
            blk_seg.append(k)
            blk_tok.append(t)
    meta = torch.tensor([tok_start, tok_end, ranks, a_off, b_off, h_off], dtype=torch.int64)
    blocks = torch.tensor([blk_seg, blk_tok], dtype=torch.int64).reshape(2, -1)
    return _Plan(
        tok_start=tok_start,
        tok_end=tok_end,
        ranks=ranks,
        scales=scales,
        a_off=a_off,
        b_off=b_off,
        h_off=h_off,
        h_total=h_cur,
        seg_meta=meta.to(device),
        seg_scale=torch.tensor(scales, dtype=torch.float32).to(device),
        blocks=blocks.to(device),
        n_blocks=len(blk_seg),
        block_m=block_m,
        block_r=block_r,
        interpret=interpret,
    )


def _dot_f32(plan: _Plan, dtype: torch.dtype) -> bool:
    # The interpreter cannot do bf16 arithmetic; fp32 inputs use exact (ieee) fp32 dots, not tf32.
    return plan.interpret or dtype == torch.float32


def _segment_tables(plan: _Plan, w_off_row: int) -> tuple[torch.Tensor, ...]:
    """The block and segment tables both kernels take, in their parameter order; ``w_off_row``
    picks the weight offsets (``_A_OFF`` or ``_B_OFF``) of the matrix the kernel reads."""
    m = plan.seg_meta
    return (plan.blocks[0], plan.blocks[1], m[0], m[1], m[2], m[w_off_row], m[5], plan.seg_scale)


def _shrink(
    plan: _Plan,
    inp: torch.Tensor,
    w_flat: torch.Tensor,
    w_off_row: int,
    out: torch.Tensor,
    *,
    rank_major: bool,
    scale: bool,
) -> None:
    shrink, _ = _kernels()
    K = inp.shape[1]
    grid = (plan.n_blocks, triton.cdiv(max(plan.ranks), plan.block_r))
    shrink[grid](
        inp,
        w_flat,
        out,
        *_segment_tables(plan, w_off_row),
        K,
        inp.stride(0),
        W_RANK_MAJOR=rank_major,
        APPLY_SCALE=scale,
        DOT_F32=_dot_f32(plan, w_flat.dtype),
        BLOCK_M=plan.block_m,
        BLOCK_R=plan.block_r,
        BLOCK_K=64,
        num_warps=4,
    )


def _expand(
    plan: _Plan,
    inp: torch.Tensor,
    w_flat: torch.Tensor,
    w_off_row: int,
    out: torch.Tensor,
    *,
    rank_major: bool,
    scale: bool,
) -> None:
    _, expand = _kernels()
    N = out.shape[1]
    block_n = 64
    grid = (plan.n_blocks, triton.cdiv(N, block_n))
    expand[grid](
        inp,
        w_flat,
        out,
        *_segment_tables(plan, w_off_row),
        N,
        out.stride(0),
        W_RANK_MAJOR=rank_major,
        APPLY_SCALE=scale,
        DOT_F32=_dot_f32(plan, w_flat.dtype),
        BLOCK_M=plan.block_m,
        BLOCK_N=block_n,
        BLOCK_R=plan.block_r,
        num_warps=4,
    )


_A_OFF, _B_OFF = 3, 4


class _SegmentedLoraFn(torch.autograd.Function):
    """``y = segmented LoRA(x2d)`` with ``weights = (A_0, B_0, A_1, B_1, ...)``.

    ``inputs`` are the weights again, for autograd to accumulate their gradients; or, with
    ``direct`` (see ``direct_grads.weight_inputs``), a direct pass's anchor, and backward adds
    the weight gradients to their ``.grad`` itself, as the torch kernel does.
    """

    @staticmethod
    def forward(
        ctx,
        x2d: torch.Tensor,
        plan: _Plan,
        weights: tuple[torch.Tensor, ...],
        direct: bool,
        *inputs: torch.Tensor,
    ) -> torch.Tensor:
        dtype = x2d.dtype
        a_list, b_list = weights[0::2], weights[1::2]
        a_flat = torch.cat([a.detach().to(dtype).reshape(-1) for a in a_list])
        b_flat = torch.cat([b.detach().to(dtype).reshape(-1) for b in b_list])
        out_f = b_list[0].shape[0]
        h = torch.empty(plan.h_total, dtype=torch.float32, device=x2d.device)
        y = torch.zeros(x2d.shape[0], out_f, dtype=dtype, device=x2d.device)
        if plan.n_blocks:
            _shrink(plan, x2d, a_flat, _A_OFF, h, rank_major=True, scale=False)
            _expand(plan, h, b_flat, _B_OFF, y, rank_major=False, scale=True)
        ctx.plan, ctx.weights, ctx.direct = plan, weights, direct
        ctx.weight_dtypes = [w.dtype for w in weights]
        ctx.save_for_backward(x2d, h, a_flat, b_flat)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2d, h, a_flat, b_flat = ctx.saved_tensors
        plan: _Plan = ctx.plan
        dy = dy.to(x2d.dtype).contiguous()
        dh = torch.empty(plan.h_total, dtype=torch.float32, device=dy.device)
        if plan.n_blocks:
            _shrink(plan, dy, b_flat, _B_OFF, dh, rank_major=False, scale=True)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.zeros_like(x2d)
            if plan.n_blocks:
                _expand(plan, dh, a_flat, _A_OFF, dx, rank_major=True, scale=False)
        grads: list[torch.Tensor | None] = []
        for k, r in enumerate(plan.ranks):
            ts, te, ho = plan.tok_start[k], plan.tok_end[k], plan.h_off[k]
            n = te - ts
            # direct: every weight gets its gradient (the caller attached every .grad)
            need_a = ctx.direct or ctx.needs_input_grad[4 + 2 * k]
            need_b = ctx.direct or ctx.needs_input_grad[5 + 2 * k]
            da = db = None
            if need_a:
                dh_k = dh[ho : ho + n * r].view(n, r).to(x2d.dtype)
                da = (dh_k.t() @ x2d[ts:te]).to(ctx.weight_dtypes[2 * k])
            if need_b:
                h_k = h[ho : ho + n * r].view(n, r).to(dy.dtype)
                db = (dy[ts:te].t() @ h_k).mul_(plan.scales[k]).to(ctx.weight_dtypes[2 * k + 1])
            grads.extend([da, db])
        if ctx.direct:
            direct_grads.add_weight_grads(ctx.weights, grads)
            return (dx, None, None, None, None)  # None: the anchor gets no gradient
        return (dx, None, None, None, *grads)


def _apply_dropout(
    x2d: torch.Tensor, segments: Sequence[LoraSegment], masks, tokens_per_row: int
) -> torch.Tensor:
    """``x2d`` ([tokens, in]) with each segment's dropout mask (``dropout_masks``) applied to its
    tokens, in torch: differentiable, autograd keeps the masks."""
    pieces: list[torch.Tensor] = []
    cursor = 0
    for seg, mask in zip(segments, masks):
        start, end = seg.start * tokens_per_row, seg.end * tokens_per_row
        if start > cursor:
            pieces.append(x2d[cursor:start])
        part = x2d[start:end]
        pieces.append(part if mask is None else part * mask)
        cursor = end
    if cursor < x2d.shape[0]:
        pieces.append(x2d[cursor:])
    return torch.cat(pieces, dim=0)


def segmented_lora_triton(
    x: torch.Tensor,
    segments: list[LoraSegment],
    out_features: int,
    *,
    anchor: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of ``segmented_lora_reference``: same arguments, result and gradients.

    Args:
        x: Input activations ``[rows, ..., in]`` (fp32, bf16 or fp16); dim 0 indexes rows.
        segments: Non-overlapping segments sorted by ``start``; ranks may differ.
        out_features: Output width.
        anchor: A direct pass's anchor on ``x``'s device (``direct_grads``): backward then adds
            the weight gradients to their ``.grad`` itself. None: autograd accumulates them.

    Returns:
        ``[rows, ..., out_features]`` in ``x``'s dtype; zero on rows outside every segment.

    Raises:
        RuntimeError: Triton is not installed, or ``x`` is on the CPU without
            ``TRITON_INTERPRET=1``.
        ValueError: Segments out of order, overlapping, out of range, or with mis-shaped weights.
    """
    if triton is None:
        raise RuntimeError(
            "segmented_lora_triton needs the 'triton' package, which failed to import "
            f"({_TRITON_IMPORT_ERROR!r}); install triton or use segmented_lora_reference"
        )
    interpret = triton_interpret()
    if x.device.type == "cpu" and not interpret:
        raise RuntimeError(
            "segmented_lora_triton on CPU tensors needs the Triton interpreter: set "
            "TRITON_INTERPRET=1 (or use segmented_lora_reference)"
        )
    validate_segments(x, segments, out_features)
    out_shape = (*x.shape[:-1], out_features)
    active = [s for s in segments if s.end > s.start]
    tokens_per_row = math.prod(x.shape[1:-1])
    if not active or tokens_per_row == 0:
        return x.new_zeros(out_shape)
    in_f = x.shape[-1]
    x2d = x.reshape(-1, in_f)
    if any(seg.dropout is not None for seg in active):
        x2d = _apply_dropout(x2d, active, dropout_masks(x, active), tokens_per_row)
    x2d = x2d.contiguous()
    plan = _build_plan(active, tokens_per_row, in_f, out_features, x.device, interpret)
    weights = tuple(w for seg in active for w in (seg.lora_A, seg.lora_B))
    direct, inputs = direct_grads.weight_inputs(weights, anchor)
    y = _SegmentedLoraFn.apply(x2d, plan, weights, direct, *inputs)
    return y.reshape(out_shape)
