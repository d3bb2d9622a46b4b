"""Token log-probabilities straight from the last hidden states and the LM head, in tiles.

``log p(target_t) = h_t . w_target - logsumexp(h_t W^T)``. The usual path materialises the
``[tokens, vocab]`` logits, their log-softmax and, in backward, their gradient: at a 150k-250k
vocabulary that is several megabytes per token, more than the decoder layers keep. Here the
logits are walked in tiles of (a chunk of tokens) x (a slice of the vocabulary), with a running
maximum and running sums per token (the online softmax of flash attention), so no tile outlives
its step and no tensor of ``[tokens, vocab]`` is ever whole (:class:`Tiles`):

- a frozen head (a LoRA base model's): the gradient of ``log p(target_t)`` with respect to
  ``h_t`` is ``w_target - E_p[w]``, and the expected head row ``E_p[w] = softmax_t @ W`` is one
  ``[hidden]`` vector per token, summed in the forward over the tiles' exponentials. Backward is
  then a gather and a subtraction: no second pass over the vocabulary.
- a trainable head, or one with a LoRA adapter: backward computes each tile's logits again and
  turns them into the gradients of the hidden states, the adapter and the head.

Values and gradients equal the materialised path's (same fp32 arithmetic per row, in another
summation order).

A head split by vocabulary rows over a process group (megatron's tensor parallel,
:class:`VocabShard`) takes the same tiles over its own rows: the row maximum, the sum of
exponentials (and the entropy's sum) are all-reduced over the group, the target's logit coming
from the rank that holds it; each rank's gradient of the (whole) hidden states is its rows' part,
which the shard's ``enter`` sums over the group in backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from twinkle.data_format import IGNORE_INDEX

# fp32 logits one tile of (tokens x vocabulary columns) may hold; ExecutionOptions.linear_chunk_bytes
# sets it for the training step.
DEFAULT_CHUNK_BYTES = 32 << 20
# Fewest vocabulary columns a tile takes. The tile spans the chunk's tokens and a slice of the
# head's rows: a product of many tokens with a slice of the head runs at full speed, where a
# product of a few tokens with the whole head pays for re-packing all of it per call (figures in
# docs/performance.md, "Tiles of tokens by vocabulary").
MIN_TILE_COLUMNS = 4096


class Tiles(NamedTuple):
    """How a ``[tokens, vocab]`` logits matrix is walked: ``rows`` tokens at a time, and within
    them ``columns`` vocabulary entries at a time."""

    rows: int
    columns: int

    @classmethod
    def of(cls, tokens: int, vocab: int, chunk_bytes: int) -> Tiles:
        columns = min(vocab, max(MIN_TILE_COLUMNS, chunk_bytes // (4 * max(tokens, 1))))
        return cls(max(1, min(max(tokens, 1), chunk_bytes // (4 * columns))), max(1, columns))


class VocabShard(NamedTuple):
    """This process's rows ``start : start + rows`` of a head split by vocabulary rows over
    ``group`` (each process holds one contiguous, equal slice; the hidden states are whole on
    each)."""

    start: int
    group: Any
    enter: Callable[[torch.Tensor], torch.Tensor]
    """Identity in forward; sums the gradient over ``group`` in backward (for the hidden states
    and the head adapter's low-rank input, whole on every process)."""
    rows_of: Callable[[torch.Tensor], torch.Tensor]
    """A whole ``[vocab, r]`` tensor's rows of this shard; its gradient is made whole (the head
    adapter's ``B``)."""
    gather: Callable[[torch.Tensor], torch.Tensor]
    """``[..., rows]`` logits of every process concatenated along the vocabulary."""


def _targets_of(targets_C, vocab_rows, shard):
    """(valid, this shard's target column (0 where none), the target is in this shard)."""
    valid_C = targets_C != IGNORE_INDEX
    if shard is None:
        return valid_C, torch.where(valid_C, targets_C, 0), valid_C
    local_C = targets_C - shard.start
    owned_C = valid_C & (local_C >= 0) & (local_C < vocab_rows)
    return valid_C, torch.where(owned_C, local_C, 0), owned_C


class _Head(NamedTuple):
    """The head one chunk of tokens goes through: ``logits = hidden W^T (+ u B^T)``."""

    weight_V_H: torch.Tensor
    lora_B_V_R: torch.Tensor | None = None

    @property
    def vocab(self) -> int:
        return self.weight_V_H.shape[0]

    def logits(self, hidden_C_H, u_C_R, cols):
        """The chunk's fp32 logits over the vocabulary columns ``cols`` (a slice)."""
        out = (hidden_C_H @ self.weight_V_H[cols].T).float()
        if self.lora_B_V_R is not None:
            out.addmm_(u_C_R.float(), self.lora_B_V_R[cols].T.float())
        return out


def _in_tile(local_C, owned_C, start, width):
    """(the target is in the tile of columns ``start : start + width``, its column there
    (clamped into the tile where it is not))."""
    here_C = owned_C & (local_C >= start) & (local_C < start + width)
    return here_C, (local_C - start).clamp_(0, width - 1)


def _column_slices(vocab, columns):
    return [slice(c, min(c + columns, vocab)) for c in range(0, vocab, columns)]


def _chunk_stats(head, hidden_C_H, u_C_R, targets_C, tiles, want_entropy, shard, expect_rows):
    """(logprobs, hits, logsumexp, entropies or None, expected head rows or None) of one chunk
    of tokens, walking the vocabulary in tiles with a running maximum (the online softmax): each
    tile's logits become ``exp(logit - running max)`` in place and are dropped before the next.
    ``expect_rows``: also ``softmax @ W`` (this shard's part). ``shard``: the head is this
    process's rows, and the row figures are reduced over its group."""
    valid_C, local_C, owned_C = _targets_of(targets_C, head.vocab, shard)
    target_C = torch.zeros_like(targets_C, dtype=torch.float32)
    max_C = sum_C = weighted_C = expected_C_H = None
    for cols in _column_slices(head.vocab, tiles.columns):
        tile_C_V = head.logits(hidden_C_H, u_C_R, cols)
        width = tile_C_V.shape[1]
        here_C, at_C = _in_tile(local_C, owned_C, cols.start, width)
        target_C += torch.where(here_C, tile_C_V.gather(-1, at_C[:, None]).squeeze(-1), 0.0)
        # The running maximum serves both the stable logsumexp and the argmax hit (the target's
        # logit is the largest; amax, not argmax, which is much slower on CPU and differs only
        # on an exact tie).
        new_max_C = tile_C_V.amax(-1) if max_C is None else torch.maximum(max_C, tile_C_V.amax(-1))
        shifted_C_V = tile_C_V.sub_(new_max_C[:, None])
        tile_weighted_C = (shifted_C_V.exp() * shifted_C_V).sum(-1) if want_entropy else None
        exps_C_V = shifted_C_V.exp_()
        tile_sum_C = exps_C_V.sum(-1)
        tile_expected_C_H = (
            (exps_C_V.to(head.weight_V_H.dtype) @ head.weight_V_H[cols]).float()
            if expect_rows
            else None
        )
        del tile_C_V, shifted_C_V, exps_C_V
        if max_C is None:
            sum_C, weighted_C, expected_C_H = tile_sum_C, tile_weighted_C, tile_expected_C_H
        else:
            sum_C, weighted_C, expected_C_H = _rescaled(
                max_C, new_max_C, sum_C, weighted_C, expected_C_H
            )
            sum_C += tile_sum_C
            if want_entropy:
                weighted_C += tile_weighted_C
            if expect_rows:
                expected_C_H += tile_expected_C_H
        max_C = new_max_C
    if shard is not None:
        local_max_C = max_C.clone()
        dist.all_reduce(max_C, op=dist.ReduceOp.MAX, group=shard.group)
        sum_C, weighted_C, expected_C_H = _rescaled(
            local_max_C, max_C, sum_C, weighted_C, expected_C_H
        )
        parts = [sum_C, torch.where(owned_C, target_C, 0.0)]
        parts += [weighted_C] if want_entropy else []
        reduced = torch.stack(parts)
        dist.all_reduce(reduced, group=shard.group)
        sum_C, target_C = reduced[0], reduced[1]
        if want_entropy:
            weighted_C = reduced[2]
    lse_C = max_C + sum_C.log()
    return (
        torch.where(valid_C, target_C - lse_C, 0.0),
        valid_C & (target_C >= max_C),
        lse_C,
        sum_C.log() - weighted_C / sum_C if want_entropy else None,
        expected_C_H / sum_C[:, None] if expect_rows else None,
    )


def _rescaled(old_max_C, new_max_C, sum_C, weighted_C, expected_C_H):
    """The running sums of ``exp(logit - old max)`` (and of ``exp(s) * s``, ``exp(s) * w``)
    re-based to ``new max``: ``sum e^(l - n) (l - n) = r (sum e^(l - o) (l - o) + (o - n)
    sum e^(l - o))`` with ``r = e^(o - n)``."""
    shift_C = old_max_C - new_max_C
    ratio_C = shift_C.exp()
    if weighted_C is not None:
        weighted_C = (weighted_C + shift_C * sum_C) * ratio_C
    if expected_C_H is not None:
        expected_C_H = expected_C_H * ratio_C[:, None]
    return sum_C * ratio_C, weighted_C, expected_C_H


def _forward(head, hidden_N_H, u_N_R, targets_N, tiles, want_entropy, shard, expect_rows):
    """Every chunk's figures: (logprobs, hits, logsumexps, entropies ([0] when not asked),
    expected head rows or None)."""
    tokens = hidden_N_H.shape[0]
    logprobs_N = hidden_N_H.new_zeros(tokens, dtype=torch.float32)
    hits_N = torch.zeros(tokens, dtype=torch.bool, device=hidden_N_H.device)
    lse_N = hidden_N_H.new_zeros(tokens, dtype=torch.float32)
    entropy_N = hidden_N_H.new_zeros(tokens if want_entropy else 0, dtype=torch.float32)
    expected_N_H = (
        hidden_N_H.new_zeros(hidden_N_H.shape, dtype=torch.float32) if expect_rows else None
    )
    for start in range(0, tokens, tiles.rows):
        rows = slice(start, start + tiles.rows)
        logprobs_N[rows], hits_N[rows], lse_N[rows], entropy_C, expected_C_H = _chunk_stats(
            head,
            hidden_N_H[rows],
            None if u_N_R is None else u_N_R[rows],
            targets_N[rows],
            tiles,
            want_entropy,
            shard,
            expect_rows,
        )
        if want_entropy:
            entropy_N[rows] = entropy_C
        if expect_rows:
            expected_N_H[rows] = expected_C_H
    return logprobs_N, hits_N, lse_N, entropy_N, expected_N_H


def _backward(head, hidden_N_H, u_N_R, targets_N, lse_N, grad_N, tiles, shard, needs):
    """Gradients of (hidden, u, W, B) from each tile's logits computed again: ``d logprob /
    d logits = onehot(target) - softmax``, times the log-probs' gradient, zero for ignored
    tokens. ``needs``: which of the four are wanted (None for the others)."""
    need_h, need_u, need_w, need_b = needs
    grad_h = torch.zeros_like(hidden_N_H) if need_h else None
    grad_u = torch.zeros_like(u_N_R) if need_u else None
    grad_w = torch.zeros_like(head.weight_V_H, dtype=torch.float32) if need_w else None
    grad_b = torch.zeros_like(head.lora_B_V_R, dtype=torch.float32) if need_b else None
    weight_V_H, lora_B_V_R = head.weight_V_H, head.lora_B_V_R
    for start in range(0, hidden_N_H.shape[0], tiles.rows):
        rows = slice(start, start + tiles.rows)
        h_C_H = hidden_N_H[rows]
        u_C_R = None if u_N_R is None else u_N_R[rows]
        valid_C, local_C, owned_C = _targets_of(targets_N[rows], head.vocab, shard)
        scale_C = torch.where(valid_C, grad_N[rows].float(), 0.0)
        lse_C = lse_N[rows]
        acc_h = h_C_H.new_zeros(h_C_H.shape, dtype=torch.float32) if need_h else None
        acc_u = u_C_R.new_zeros(u_C_R.shape, dtype=torch.float32) if need_u else None
        for cols in _column_slices(head.vocab, tiles.columns):
            grad_C_V = head.logits(h_C_H, u_C_R, cols)
            width = grad_C_V.shape[1]
            grad_C_V.sub_(lse_C[:, None]).exp_().mul_(-scale_C[:, None])
            here_C, at_C = _in_tile(local_C, owned_C, cols.start, width)
            grad_C_V.scatter_add_(-1, at_C[:, None], torch.where(here_C, scale_C, 0.0)[:, None])
            if need_h:
                acc_h += (grad_C_V.to(weight_V_H.dtype) @ weight_V_H[cols]).float()
            if need_u:
                acc_u += (grad_C_V.to(lora_B_V_R.dtype) @ lora_B_V_R[cols]).float()
            if need_w:
                grad_w[cols] += grad_C_V.T @ h_C_H.float()
            if need_b:
                grad_b[cols] += grad_C_V.T @ u_C_R.float()
        if need_h:
            grad_h[rows] = acc_h.to(h_C_H.dtype)
        if need_u:
            grad_u[rows] = acc_u.to(u_C_R.dtype)
    grad_w = grad_w.to(weight_V_H.dtype) if need_w else None
    grad_b = grad_b.to(lora_B_V_R.dtype) if need_b else None
    return grad_h, grad_u, grad_w, grad_b


class _LinearLogprobs(torch.autograd.Function):
    """``(hidden [N, H], weight [V, H], targets [N]) -> (logprobs [N], argmax hits [N],
    entropies [N] or [0])``; ``shard``: ``weight`` is this process's rows of the head.

    A frozen head (a LoRA base model's): the gradient of ``log p(target_t)`` with respect to
    ``h_t`` is ``w_target - E_p[w]``, and the expected head row ``E_p[w] = softmax_t @ W`` is one
    ``[hidden]`` vector per token, taken in the forward from each tile's exponentials. Backward
    is then a gather and a subtraction: no second pass over the vocabulary. A trainable head:
    backward computes each tile's logits again."""

    @staticmethod
    def forward(ctx, hidden_N_H, weight_V_H, targets_N, tiles, want_entropy, shard=None):
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        expect_rows = need_hidden and not need_weight
        logprobs_N, hits_N, lse_N, entropy_N, expected_N_H = _forward(
            _Head(weight_V_H), hidden_N_H, None, targets_N, tiles, want_entropy, shard, expect_rows
        )
        if expect_rows:
            ctx.save_for_backward(weight_V_H, targets_N, expected_N_H)
        else:
            ctx.save_for_backward(hidden_N_H, weight_V_H, targets_N, lse_N)
        ctx.expect_rows = expect_rows
        ctx.tiles, ctx.shard = tiles, shard
        ctx.hidden_dtype = hidden_N_H.dtype
        ctx.mark_non_differentiable(hits_N, entropy_N)
        return logprobs_N, hits_N, entropy_N

    @staticmethod
    def backward(ctx, grad_logprobs_N, _grad_hits, _grad_entropy):
        if ctx.expect_rows:
            weight_V_H, targets_N, expected_N_H = ctx.saved_tensors
            valid_N, local_N, owned_N = _targets_of(targets_N, weight_V_H.shape[0], ctx.shard)
            scale_N = torch.where(valid_N, grad_logprobs_N.float(), 0.0)
            # The target's head row where this shard holds it (the others' add theirs).
            target_rows_N_H = weight_V_H[local_N].float() * owned_N[:, None]
            grad_hidden = (target_rows_N_H - expected_N_H).mul_(scale_N[:, None])
            return grad_hidden.to(ctx.hidden_dtype), None, None, None, None, None
        hidden_N_H, weight_V_H, targets_N, lse_N = ctx.saved_tensors
        needs = (ctx.needs_input_grad[0], False, ctx.needs_input_grad[1], False)
        grad_h, _, grad_w, _ = _backward(
            _Head(weight_V_H),
            hidden_N_H,
            None,
            targets_N,
            lse_N,
            grad_logprobs_N,
            ctx.tiles,
            ctx.shard,
            needs,
        )
        return grad_h, grad_w, None, None, None, None


class _LoraHeadLogprobs(torch.autograd.Function):
    """Log-probs through a head with a LoRA adapter: ``logits = h W^T + u B^T``, where
    ``u = scaling * dropout(h) A^T`` (``[N, r]``, computed by autograd outside) and ``W`` is the
    frozen base head. ``(hidden [N, H], u [N, r], W [V, H], B [V, r], targets [N]) ->
    (logprobs [N], hits [N], entropies [N] or [0])``. Backward computes each tile's logits again
    and gives the gradients of ``h``, ``u`` and ``B`` (``[V, r]``, small); ``W`` gets one only
    when it is trainable. ``shard``: ``W`` and ``B`` are this process's rows."""

    @staticmethod
    def forward(
        ctx, hidden_N_H, u_N_R, weight_V_H, lora_B_V_R, targets_N, tiles, want_entropy, shard=None
    ):
        logprobs_N, hits_N, lse_N, entropy_N, _ = _forward(
            _Head(weight_V_H, lora_B_V_R),
            hidden_N_H,
            u_N_R,
            targets_N,
            tiles,
            want_entropy,
            shard,
            False,
        )
        ctx.save_for_backward(hidden_N_H, u_N_R, weight_V_H, lora_B_V_R, targets_N, lse_N)
        ctx.tiles, ctx.shard = tiles, shard
        ctx.mark_non_differentiable(hits_N, entropy_N)
        return logprobs_N, hits_N, entropy_N

    @staticmethod
    def backward(ctx, grad_logprobs_N, _grad_hits, _grad_entropy):
        hidden_N_H, u_N_R, weight_V_H, lora_B_V_R, targets_N, lse_N = ctx.saved_tensors
        grads = _backward(
            _Head(weight_V_H, lora_B_V_R),
            hidden_N_H,
            u_N_R,
            targets_N,
            lse_N,
            grad_logprobs_N,
            ctx.tiles,
            ctx.shard,
            tuple(ctx.needs_input_grad[:4]),
        )
        return (*grads, None, None, None, None)


class LoraHeadRows(NamedTuple):
    """Rows ``start:end`` of a pass whose LM head carries an adapter: its low-rank input
    ``u`` (``[rows, T, r]``, ``scaling * dropout(h) A^T``) and its ``B`` (``[V, r]``)."""

    start: int
    end: int
    u: torch.Tensor
    lora_B: torch.Tensor


class TokenStats(NamedTuple):
    """Per-token figures of :func:`linear_token_logprobs`, each ``[B, T]``."""

    logprobs: torch.Tensor
    """``log p(target)`` in fp32, 0 where the target is -100; differentiable."""
    hits: torch.Tensor
    """Whether the target is the argmax (bool)."""
    entropies: torch.Tensor | None
    """Entropy of the predicted distribution (fp32, no gradient), where asked for."""


def linear_token_logprobs(
    hidden_B_T_H: torch.Tensor,
    weight_V_H: torch.Tensor,
    targets_B_T: torch.Tensor,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    entropies: bool = False,
    lora: Sequence[LoraHeadRows] = (),
    shard: VocabShard | None = None,
) -> TokenStats:
    """Per-token ``log p(target)``, argmax hits and, when ``entropies``, the entropies.

    Args:
        hidden_B_T_H: The last (normalised) hidden states.
        weight_V_H: The LM head's weight (the input embeddings for a tied head).
        targets_B_T: Target token ids, -100 where none.
        chunk_bytes: fp32 logits one tile of tokens x vocabulary columns may hold
            (:class:`Tiles`).
        entropies: Also the entropy of each token's distribution (one more pass over each
            tile's logits).
        lora: Row ranges whose head carries an adapter (:class:`LoraHeadRows`, not
            overlapping); the other rows go through the plain head.
        shard: ``weight`` is this process's rows of a head split over a group
            (:class:`VocabShard`; the adapters' ``lora_B`` stay whole); every process of the
            group calls with the same hidden states and targets and gets the same figures.

    Returns:
        A :class:`TokenStats`; gradients flow from the log-probs to the hidden states and the
        head.
    """
    batch, seq, width = hidden_B_T_H.shape
    vocab = weight_V_H.shape[0]
    if shard is not None:
        hidden_B_T_H = shard.enter(hidden_B_T_H)
    parts, row = [], 0
    for seg in sorted(lora, key=lambda s: s.start):
        if seg.start > row:
            parts.append(
                _plain(
                    hidden_B_T_H[row : seg.start],
                    weight_V_H,
                    targets_B_T[row : seg.start],
                    chunk_bytes,
                    entropies,
                    shard,
                )
            )
        rows = seg.end - seg.start
        u, lora_B = seg.u, seg.lora_B
        if shard is not None:
            u, lora_B = shard.enter(u), shard.rows_of(lora_B)
        parts.append(
            _LoraHeadLogprobs.apply(
                hidden_B_T_H[seg.start : seg.end].reshape(rows * seq, width),
                u.reshape(rows * seq, -1),
                weight_V_H,
                lora_B,
                targets_B_T[seg.start : seg.end].reshape(-1),
                Tiles.of(rows * seq, vocab, chunk_bytes),
                entropies,
                shard,
            )
        )
        row = seg.end
    if row < batch or not parts:
        parts.append(
            _plain(hidden_B_T_H[row:], weight_V_H, targets_B_T[row:], chunk_bytes, entropies, shard)
        )
    logprobs_N, hits_N, entropy_N = (
        parts[0] if len(parts) == 1 else [torch.cat(column) for column in zip(*parts)]
    )
    return TokenStats(
        logprobs_N.reshape(batch, seq),
        hits_N.reshape(batch, seq),
        entropy_N.reshape(batch, seq) if entropies else None,
    )


def _plain(hidden_B_T_H, weight_V_H, targets_B_T, chunk_bytes, entropies, shard=None):
    rows, seq, width = hidden_B_T_H.shape
    return _LinearLogprobs.apply(
        hidden_B_T_H.reshape(rows * seq, width),
        weight_V_H,
        targets_B_T.reshape(-1),
        Tiles.of(rows * seq, weight_V_H.shape[0], chunk_bytes),
        entropies,
        shard,
    )


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "MIN_TILE_COLUMNS",
    "LoraHeadRows",
    "Tiles",
    "TokenStats",
    "VocabShard",
    "linear_token_logprobs",
]
