"""The mock model's maths: a frozen embedding/unembedding pair with a low-rank adapter on the
hidden state, and its analytic gradients.

``h = E[x] + scale * (E[x] @ A) @ B`` and ``logits = h @ W``. Everything is float64 numpy, so
results are bitwise deterministic and finite differences are accurate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class BaseWeights:
    """The frozen, shared base model: embeddings ``E [V, H]`` and unembedding ``W [H, V]``."""

    embed_V_H: np.ndarray
    unembed_H_V: np.ndarray

    @classmethod
    def from_seed(cls, vocab_size: int, hidden_size: int, seed: int) -> BaseWeights:
        """Draw the base weights deterministically; logits come out roughly unit scale."""
        rng = np.random.default_rng(seed)
        embed = rng.standard_normal((vocab_size, hidden_size))
        unembed = rng.standard_normal((hidden_size, vocab_size)) / np.sqrt(hidden_size)
        return cls(embed, unembed)


@dataclass
class ForwardCache:
    """What the backward pass needs from the forward pass."""

    embed_N_H: np.ndarray
    down_N_R: np.ndarray
    probs_N_V: np.ndarray


def forward(
    base: BaseWeights, a_H_R: np.ndarray, b_R_H: np.ndarray, scale: float, ids_N: np.ndarray
) -> tuple[np.ndarray, ForwardCache]:
    """Run the model on flattened positions and return log-softmax logits and the cache.

    Args:
        base: frozen base weights.
        a_H_R: adapter down projection.
        b_R_H: adapter up projection.
        scale: ``lora_alpha / r``.
        ids_N: input token ids of every position.

    Returns:
        ``logprobs [N, V]`` over the vocabulary, and the cache for :func:`backward`.
    """
    embed_N_H = base.embed_V_H[ids_N]
    down_N_R = embed_N_H @ a_H_R
    hidden_N_H = embed_N_H + scale * (down_N_R @ b_R_H)
    logits_N_V = hidden_N_H @ base.unembed_H_V
    shifted = logits_N_V - logits_N_V.max(axis=-1, keepdims=True)
    logprobs_N_V = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return logprobs_N_V, ForwardCache(embed_N_H, down_N_R, np.exp(logprobs_N_V))


def backward(
    base: BaseWeights,
    b_R_H: np.ndarray,
    scale: float,
    cache: ForwardCache,
    targets_N: np.ndarray,
    dloss_dlp_N: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of the loss wrt the adapter, given dloss/d(target logprob) per position.

    Every supported loss depends on the logits only through the target log-probabilities, so
    ``dloss/dlogits = g * (onehot - softmax)`` with ``g = dloss/dlp`` (0 where not a target).

    Returns:
        ``(dA [H, R], dB [R, H])``.
    """
    dlogits_N_V = -dloss_dlp_N[:, None] * cache.probs_N_V
    dlogits_N_V[np.arange(len(targets_N)), targets_N] += dloss_dlp_N
    dhidden_N_H = dlogits_N_V @ base.unembed_H_V.T
    grad_b = scale * cache.down_N_R.T @ dhidden_N_H
    grad_a = cache.embed_N_H.T @ (scale * dhidden_N_H @ b_R_H.T)
    return grad_a, grad_b
