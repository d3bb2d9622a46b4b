"""Choosing the next token: penalties, temperature, top-k / top-p, and per-row seeded draws.

Every row draws from its own ``torch.Generator``, so a row's samples depend only on its seed
and its logits, never on which other rows share the batch.
"""

from __future__ import annotations

import torch

from twinkle.sampler.types import SamplingParams

_SEED_MOD = 2**63 - 1


def row_seeds(seed: int | None, num_inputs: int, num_samples: int) -> list[int]:
    """One seed per (input, sample) row, input-major.

    With a seed, sample ``k`` of any input uses ``seed`` and ``k`` only, so an input gives the
    same samples in any batch. Without one, seeds come from torch's global RNG.
    """
    if seed is None:
        draws = torch.randint(0, 2**62, (num_inputs * num_samples,))
        return [int(x) for x in draws]
    return [
        (int(seed) * 1_000_003 + k) % _SEED_MOD
        for _ in range(num_inputs)
        for k in range(num_samples)
    ]


def apply_repetition_penalty(
    logits_B_V: torch.Tensor, seen_B_V: torch.Tensor, penalty: float
) -> torch.Tensor:
    """HF/vLLM rule: seen tokens' positive logits are divided by ``penalty``, negative multiplied."""
    if penalty == 1.0:
        return logits_B_V
    penalised = torch.where(logits_B_V > 0, logits_B_V / penalty, logits_B_V * penalty)
    return torch.where(seen_B_V, penalised, logits_B_V)


def filter_top_k_top_p(logits_B_V: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to ``-inf`` every logit outside the top ``k`` and outside the nucleus of mass ``p``."""
    vocab = logits_B_V.shape[-1]
    if 0 < top_k < vocab:
        kth_B_1 = torch.topk(logits_B_V, top_k, dim=-1).values[:, -1:]
        logits_B_V = logits_B_V.masked_fill(logits_B_V < kth_B_1, float("-inf"))
    if top_p < 1.0:
        sorted_B_V, order_B_V = torch.sort(logits_B_V, dim=-1, descending=True)
        cum_B_V = torch.softmax(sorted_B_V, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first token always stays).
        drop_B_V = (cum_B_V - torch.softmax(sorted_B_V, dim=-1)) >= top_p
        drop_B_V[:, 0] = False
        logits_B_V = logits_B_V.masked_fill(
            drop_B_V.scatter(-1, order_B_V, drop_B_V), float("-inf")
        )
    return logits_B_V


def choose_tokens(
    logits_B_V: torch.Tensor,
    seen_B_V: torch.Tensor,
    params: SamplingParams,
    generators: list[torch.Generator],
) -> torch.Tensor:
    """The next token of every row ([B], int64), on the CPU."""
    logits_B_V = apply_repetition_penalty(logits_B_V.float(), seen_B_V, params.repetition_penalty)
    if params.temperature == 0:
        return logits_B_V.argmax(dim=-1).cpu()
    logits_B_V = filter_top_k_top_p(logits_B_V / params.temperature, params.top_k, params.top_p)
    cdf_B_V = torch.softmax(logits_B_V, dim=-1).cumsum(dim=-1).cpu()
    # Inverse-CDF draw with one uniform per row from the row's own generator; 1 - U is in (0, 1],
    # so a zero-probability token (flat CDF step) is never picked.
    u_B = torch.stack([1.0 - torch.rand((), generator=g) for g in generators])
    picked_B = torch.searchsorted(cdf_B_V, (u_B * cdf_B_V[:, -1]).unsqueeze(-1)).squeeze(-1)
    return picked_B.clamp(max=cdf_B_V.shape[-1] - 1)
