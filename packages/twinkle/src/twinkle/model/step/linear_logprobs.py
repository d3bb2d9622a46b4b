"""Token log-probabilities straight from the last hidden states and the LM head, in token chunks.

``log p(target_t) = h_t . w_target - logsumexp(h_t W^T)``. The usual path materialises the
``[tokens, vocab]`` logits, their log-softmax and, in backward, their gradient: at a 150k-250k
vocabulary that is several megabytes per token, more than the decoder layers keep. Here each chunk
of tokens computes its logits, keeps only what the loss needs (target logit, logsumexp, argmax
hit) and drops them; backward computes the chunk's logits again and turns them into the
gradients of the hidden states and the head, so no tensor of ``[tokens, vocab]`` outlives one
chunk. Values and gradients equal the materialised path's (same fp32 arithmetic per row).
"""

from __future__ import annotations

import torch

from twinkle.data_format import IGNORE_INDEX

# Logits bytes (fp32) one chunk may hold: the chunk's tokens are this over 4 * vocab.
DEFAULT_CHUNK_BYTES = 64 << 20


class _LinearLogprobs(torch.autograd.Function):
    """``(hidden [N, H], weight [V, H], targets [N]) -> (logprobs [N], argmax hits [N])``."""

    @staticmethod
    def forward(ctx, hidden_N_H, weight_V_H, targets_N, chunk):
        logprobs_N = hidden_N_H.new_zeros(hidden_N_H.shape[0], dtype=torch.float32)
        hits_N = torch.zeros(hidden_N_H.shape[0], dtype=torch.bool, device=hidden_N_H.device)
        lse_N = hidden_N_H.new_zeros(hidden_N_H.shape[0], dtype=torch.float32)
        for start in range(0, hidden_N_H.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits_C_V = (hidden_N_H[rows] @ weight_V_H.T).float()
            targets_C = targets_N[rows]
            valid_C = targets_C != IGNORE_INDEX
            safe_C = torch.where(valid_C, targets_C, 0)
            lse_C = torch.logsumexp(logits_C_V, dim=-1)
            target_logit_C = logits_C_V.gather(-1, safe_C[:, None]).squeeze(-1)
            logprobs_N[rows] = torch.where(valid_C, target_logit_C - lse_C, 0.0)
            hits_N[rows] = valid_C & (logits_C_V.argmax(-1) == safe_C)
            lse_N[rows] = lse_C
        ctx.save_for_backward(hidden_N_H, weight_V_H, targets_N, lse_N)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(hits_N)
        return logprobs_N, hits_N

    @staticmethod
    def backward(ctx, grad_logprobs_N, _grad_hits):
        hidden_N_H, weight_V_H, targets_N, lse_N = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden_N_H) if need_hidden else None
        grad_weight = torch.zeros_like(weight_V_H, dtype=torch.float32) if need_weight else None
        for start in range(0, hidden_N_H.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            hidden_C_H = hidden_N_H[rows]
            targets_C = targets_N[rows]
            valid_C = targets_C != IGNORE_INDEX
            # d logprob / d logits = onehot(target) - softmax, zero for ignored tokens.
            scale_C = torch.where(valid_C, grad_logprobs_N[rows].float(), 0.0)
            logits_C_V = (hidden_C_H @ weight_V_H.T).float()
            grad_logits_C_V = -torch.exp(logits_C_V - lse_N[rows, None]) * scale_C[:, None]
            safe_C = torch.where(valid_C, targets_C, 0)
            grad_logits_C_V.scatter_add_(-1, safe_C[:, None], scale_C[:, None])
            del logits_C_V
            if need_hidden:
                grad_hidden[rows] = (grad_logits_C_V @ weight_V_H.float()).to(hidden_N_H.dtype)
            if need_weight:
                grad_weight += grad_logits_C_V.T @ hidden_C_H.float()
        if need_weight:
            grad_weight = grad_weight.to(weight_V_H.dtype)
        return grad_hidden, grad_weight, None, None


def linear_token_logprobs(
    hidden_B_T_H: torch.Tensor,
    weight_V_H: torch.Tensor,
    targets_B_T: torch.Tensor,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``log p(target)`` (fp32, 0 where the target is -100) and argmax hits.

    Args:
        hidden_B_T_H: The last (normalised) hidden states.
        weight_V_H: The LM head's weight (the input embeddings for a tied head).
        targets_B_T: Target token ids, -100 where none.
        chunk_bytes: fp32 logits one chunk of tokens may hold.

    Returns:
        ``(logprobs [B, T], hits [B, T])``; gradients flow to the hidden states and the head.
    """
    batch, seq, width = hidden_B_T_H.shape
    vocab = weight_V_H.shape[0]
    chunk = max(1, chunk_bytes // (4 * vocab))
    logprobs_N, hits_N = _LinearLogprobs.apply(
        hidden_B_T_H.reshape(batch * seq, width), weight_V_H, targets_B_T.reshape(-1), chunk
    )
    return logprobs_N.reshape(batch, seq), hits_N.reshape(batch, seq)


__all__ = ["DEFAULT_CHUNK_BYTES", "linear_token_logprobs"]
