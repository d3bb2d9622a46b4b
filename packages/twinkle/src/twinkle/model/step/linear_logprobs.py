"""Token log-probabilities straight from the last hidden states and the LM head, in token chunks.

``log p(target_t) = h_t . w_target - logsumexp(h_t W^T)``. The usual path materialises the
``[tokens, vocab]`` logits, their log-softmax and, in backward, their gradient: at a 150k-250k
vocabulary that is several megabytes per token, more than the decoder layers keep. Here each chunk
of tokens computes its logits, keeps only what the loss needs and drops them, so no tensor of
``[tokens, vocab]`` outlives one chunk:

- a frozen head (a LoRA base model's): the gradient of ``log p(target_t)`` with respect to
  ``h_t`` is ``w_target - E_p[w]``, and the expected head row ``E_p[w] = softmax_t @ W`` is one
  ``[hidden]`` vector per token, taken in the forward from the chunk's softmax. Backward is then
  a gather and a subtraction: no second pass over the vocabulary.
- a trainable head: backward computes each chunk's logits again and turns them into the
  gradients of the hidden states and the head.

Values and gradients equal the materialised path's (same fp32 arithmetic per row, in another
summation order).

A head split by vocabulary rows over a process group (megatron's tensor parallel,
:class:`VocabShard`) takes the same chunks: each rank computes its rows' logits of the chunk, and
the row maximum, the sum of exponentials (and the entropy's sum) are all-reduced over the group,
the target's logit coming from the rank that holds it; each rank's gradient of the (whole)
hidden states is its rows' part, which the shard's ``enter`` sums over the group in backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from twinkle.data_format import IGNORE_INDEX

# Logits bytes (fp32) one chunk may hold: the chunk's tokens are this over 4 * vocab. On a CPU a
# product of a few rows with the [vocab, hidden] head costs nearly what one of hundreds of rows
# does (the head is re-packed per call), so chunks are kept at a few hundred rows; figures in
# docs/performance.md ("Logits-free log-probs").
DEFAULT_CHUNK_BYTES = 256 << 20


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


class _LinearLogprobs(torch.autograd.Function):
    """``(hidden [N, H], weight [V, H], targets [N]) -> (logprobs [N], argmax hits [N],
    entropies [N] or [0])``; ``shard``: ``weight`` is this process's rows of the head."""

    @staticmethod
    def forward(ctx, hidden_N_H, weight_V_H, targets_N, chunk, want_entropy, shard=None):
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        expect_rows = need_hidden and not need_weight
        tokens = hidden_N_H.shape[0]
        logprobs_N = hidden_N_H.new_zeros(tokens, dtype=torch.float32)
        hits_N = torch.zeros(tokens, dtype=torch.bool, device=hidden_N_H.device)
        lse_N = hidden_N_H.new_zeros(tokens, dtype=torch.float32)
        entropy_N = hidden_N_H.new_zeros(tokens if want_entropy else 0, dtype=torch.float32)
        expected_N_H = (
            hidden_N_H.new_zeros(hidden_N_H.shape, dtype=torch.float32) if expect_rows else None
        )
        for start in range(0, tokens, chunk):
            rows = slice(start, start + chunk)
            logits_C_V = (hidden_N_H[rows] @ weight_V_H.T).float()
            stats = _chunk_stats(logits_C_V, targets_N[rows], want_entropy, shard)
            logprobs_N[rows], hits_N[rows], lse_N[rows] = stats[:3]
            if want_entropy:
                entropy_N[rows] = stats[3]
            if expect_rows:  # softmax @ W (this shard's part), from the exponentials in place
                probs_C_V = logits_C_V.div_(stats[-1][:, None])
                expected_N_H[rows] = (probs_C_V.to(weight_V_H.dtype) @ weight_V_H).float()
            del logits_C_V
        if expect_rows:
            ctx.save_for_backward(weight_V_H, targets_N, expected_N_H)
        else:
            ctx.save_for_backward(hidden_N_H, weight_V_H, targets_N, lse_N)
        ctx.expect_rows = expect_rows
        ctx.chunk, ctx.shard = chunk, shard
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
        return _recomputed_backward(ctx, grad_logprobs_N)


def _recomputed_backward(ctx, grad_logprobs_N):
    """Backward for a trainable head: each chunk's logits again, then both gradients."""
    hidden_N_H, weight_V_H, targets_N, lse_N = ctx.saved_tensors
    need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    grad_hidden = torch.zeros_like(hidden_N_H) if need_hidden else None
    grad_weight = torch.zeros_like(weight_V_H, dtype=torch.float32) if need_weight else None
    for start in range(0, hidden_N_H.shape[0], ctx.chunk):
        rows = slice(start, start + ctx.chunk)
        hidden_C_H = hidden_N_H[rows]
        grad_logits_C_V = _logits_grad(
            (hidden_C_H @ weight_V_H.T).float(),
            targets_N[rows],
            lse_N[rows],
            grad_logprobs_N[rows],
            ctx.shard,
        )
        if need_hidden:
            grad_hidden[rows] = (grad_logits_C_V.to(weight_V_H.dtype) @ weight_V_H).to(
                hidden_N_H.dtype
            )
        if need_weight:
            grad_weight += grad_logits_C_V.T @ hidden_C_H.float()
    if need_weight:
        grad_weight = grad_weight.to(weight_V_H.dtype)
    return grad_hidden, grad_weight, None, None, None, None


def _logits_grad(logits_C_V, targets_C, lse_C, grad_C, shard):
    """d logprob / d logits = onehot(target) - softmax, times the log-probs' gradient, zero for
    ignored tokens; in place over a chunk's recomputed fp32 logits (this shard's columns)."""
    valid_C, local_C, owned_C = _targets_of(targets_C, logits_C_V.shape[1], shard)
    scale_C = torch.where(valid_C, grad_C.float(), 0.0)
    logits_C_V.sub_(lse_C[:, None]).exp_().mul_(-scale_C[:, None])
    at_target_C = torch.where(owned_C, scale_C, 0.0)
    return logits_C_V.scatter_add_(-1, local_C[:, None], at_target_C[:, None])


class _LoraHeadLogprobs(torch.autograd.Function):
    """Log-probs through a head with a LoRA adapter: ``logits = h W^T + u B^T``, where
    ``u = scaling * dropout(h) A^T`` (``[N, r]``, computed by autograd outside) and ``W`` is the
    frozen base head. ``(hidden [N, H], u [N, r], W [V, H], B [V, r], targets [N]) ->
    (logprobs [N], hits [N], entropies [N] or [0])``. Backward computes each chunk's logits again
    and gives the gradients of ``h``, ``u`` and ``B`` (``[V, r]``, small); ``W`` gets one only
    when it is trainable. ``shard``: ``W`` and ``B`` are this process's rows."""

    @staticmethod
    def forward(
        ctx, hidden_N_H, u_N_R, weight_V_H, lora_B_V_R, targets_N, chunk, want_entropy, shard=None
    ):
        tokens = hidden_N_H.shape[0]
        logprobs_N = hidden_N_H.new_zeros(tokens, dtype=torch.float32)
        hits_N = torch.zeros(tokens, dtype=torch.bool, device=hidden_N_H.device)
        lse_N = hidden_N_H.new_zeros(tokens, dtype=torch.float32)
        entropy_N = hidden_N_H.new_zeros(tokens if want_entropy else 0, dtype=torch.float32)
        for start in range(0, tokens, chunk):
            rows = slice(start, start + chunk)
            logits_C_V = _lora_logits(hidden_N_H[rows], u_N_R[rows], weight_V_H, lora_B_V_R)
            stats = _chunk_stats(logits_C_V, targets_N[rows], want_entropy, shard)
            logprobs_N[rows], hits_N[rows], lse_N[rows] = stats[:3]
            if want_entropy:
                entropy_N[rows] = stats[3]
        ctx.save_for_backward(hidden_N_H, u_N_R, weight_V_H, lora_B_V_R, targets_N, lse_N)
        ctx.chunk, ctx.shard = chunk, shard
        ctx.mark_non_differentiable(hits_N, entropy_N)
        return logprobs_N, hits_N, entropy_N

    @staticmethod
    def backward(ctx, grad_logprobs_N, _grad_hits, _grad_entropy):
        hidden_N_H, u_N_R, weight_V_H, lora_B_V_R, targets_N, lse_N = ctx.saved_tensors
        need_h, need_u, need_w, need_b = ctx.needs_input_grad[:4]
        grad_h = torch.zeros_like(hidden_N_H) if need_h else None
        grad_u = torch.zeros_like(u_N_R) if need_u else None
        grad_w = torch.zeros_like(weight_V_H, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros_like(lora_B_V_R, dtype=torch.float32) if need_b else None
        for start in range(0, hidden_N_H.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            h_C_H, u_C_R = hidden_N_H[rows], u_N_R[rows]
            grad_C_V = _logits_grad(
                _lora_logits(h_C_H, u_C_R, weight_V_H, lora_B_V_R),
                targets_N[rows],
                lse_N[rows],
                grad_logprobs_N[rows],
                ctx.shard,
            )
            if need_h:
                grad_h[rows] = (grad_C_V.to(weight_V_H.dtype) @ weight_V_H).to(h_C_H.dtype)
            if need_u:
                grad_u[rows] = (grad_C_V.to(lora_B_V_R.dtype) @ lora_B_V_R).to(u_C_R.dtype)
            if need_w:
                grad_w += grad_C_V.T @ h_C_H.float()
            if need_b:
                grad_b += grad_C_V.T @ u_C_R.float()
        grad_w = grad_w.to(weight_V_H.dtype) if need_w else None
        grad_b = grad_b.to(lora_B_V_R.dtype) if need_b else None
        return grad_h, grad_u, grad_w, grad_b, None, None, None, None


def _lora_logits(hidden_C_H, u_C_R, weight_V_H, lora_B_V_R):
    """A chunk's fp32 logits through the base head plus its low-rank delta."""
    return (hidden_C_H @ weight_V_H.T).float().addmm_(u_C_R.float(), lora_B_V_R.T.float())


def _chunk_stats(logits_C_V, targets_C, want_entropy, shard=None):
    """(logprobs, hits, logsumexp[, entropies], sum of exponentials) of a chunk's fp32 logits,
    which become ``exp(logit - row max)`` in place; ``shard``: the logits are this process's
    columns, and the row figures are reduced over its group."""
    valid_C, local_C, owned_C = _targets_of(targets_C, logits_C_V.shape[1], shard)
    target_logit_C = logits_C_V.gather(-1, local_C[:, None]).squeeze(-1)
    # The row maximum serves both the stable logsumexp and the argmax hit (the target's logit
    # is the largest; amax, not argmax, which is much slower on CPU and differs only on an exact
    # tie).
    max_C = logits_C_V.amax(-1)
    if shard is not None:
        dist.all_reduce(max_C, op=dist.ReduceOp.MAX, group=shard.group)
    shifted_C_V = logits_C_V.sub_(max_C[:, None])
    if want_entropy:  # H = log sum e^s - sum(e^s s) / sum e^s, with s = logit - max
        weighted_C = (shifted_C_V.exp() * shifted_C_V).sum(-1)
    sum_C = shifted_C_V.exp_().sum(-1)
    if shard is not None:  # the target's logit from the shard holding it, zeros elsewhere
        parts = [sum_C, torch.where(owned_C, target_logit_C, 0.0)]
        parts += [weighted_C] if want_entropy else []
        reduced = torch.stack(parts)
        dist.all_reduce(reduced, group=shard.group)
        sum_C, target_logit_C = reduced[0], reduced[1]
        if want_entropy:
            weighted_C = reduced[2]
    lse_C = max_C + sum_C.log()
    out = [
        torch.where(valid_C, target_logit_C - lse_C, 0.0),
        valid_C & (target_logit_C >= max_C),
        lse_C,
    ]
    if want_entropy:
        out.append(sum_C.log() - weighted_C / sum_C)
    out.append(sum_C)
    return out


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
        chunk_bytes: fp32 logits one chunk of tokens may hold.
        entropies: Also the entropy of each token's distribution (one more pass over each
            chunk's logits).
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
    chunk = max(1, chunk_bytes // (4 * vocab))
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
                    chunk,
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
                chunk,
                entropies,
                shard,
            )
        )
        row = seg.end
    if row < batch or not parts:
        parts.append(
            _plain(hidden_B_T_H[row:], weight_V_H, targets_B_T[row:], chunk, entropies, shard)
        )
    logprobs_N, hits_N, entropy_N = (
        parts[0] if len(parts) == 1 else [torch.cat(column) for column in zip(*parts)]
    )
    return TokenStats(
        logprobs_N.reshape(batch, seq),
        hits_N.reshape(batch, seq),
        entropy_N.reshape(batch, seq) if entropies else None,
    )


def _plain(hidden_B_T_H, weight_V_H, targets_B_T, chunk, entropies, shard=None):
    rows, seq, width = hidden_B_T_H.shape
    return _LinearLogprobs.apply(
        hidden_B_T_H.reshape(rows * seq, width),
        weight_V_H,
        targets_B_T.reshape(-1),
        chunk,
        entropies,
        shard,
    )


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "LoraHeadRows",
    "TokenStats",
    "VocabShard",
    "linear_token_logprobs",
]
