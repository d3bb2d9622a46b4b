"""What the prefill's logits say about the prompt beyond its own log-probs: top-k tokens,
the log-probs of requested ids, and alternative draws (Tinker's ``topk_prompt_logprobs``,
``target_prompt_logprobs``, ``prompt_alt_tokens_k``).

Row ``i`` of every per-position result is prompt position ``i + 1``: the logits of column
``c`` predict the token of column ``c + 1`` and position 0 has no preceding context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from twinkle.errors import InvalidArgumentError
from twinkle.sampler.types import SamplingParams

_ALT_SEED_SALT = 0x5EED_A17


@dataclass
class PromptScores:
    """One prompt's extra scores (each ``None`` when not asked for)."""

    topk: list[list[tuple[int, float]] | None] | None = None
    targets: list[list[float]] | None = None
    alt_tokens: list[list[tuple[int, float]]] | None = None


def wants_prompt_scores(params: SamplingParams) -> bool:
    return bool(
        params.topk_prompt_logprobs
        or params.prompt_alt_tokens_k
        or params.target_prompt_token_ids is not None
    )


def check_prompt_params(params: SamplingParams, prompt_len: int, index: int) -> None:
    """Reject a ``prompt_logprobs_last_n`` or target rows that do not fit a prompt."""
    last_n = params.prompt_logprobs_last_n
    if last_n is not None and last_n > prompt_len - 1:
        raise InvalidArgumentError(
            f"input {index}: prompt_logprobs_last_n={last_n} must be between 1 and "
            f"len(prompt) - 1 = {prompt_len - 1}"
        )
    rows = params.target_prompt_token_ids
    if rows is not None and len(rows) != prompt_len - 1:
        raise InvalidArgumentError(
            f"input {index}: target_prompt_token_ids has {len(rows)} rows; a prompt of "
            f"{prompt_len} tokens needs {prompt_len - 1}"
        )


def blank_before_last_n(values: list, last_n: int | None) -> list:
    """``values`` (one per prompt token) with every entry before the last ``last_n`` as None."""
    if last_n is None:
        return values
    cut = len(values) - last_n
    return [None] * cut + list(values[cut:])


def score_prompt(
    logits_T_V: torch.Tensor, params: SamplingParams, seed: int, vocab: int
) -> PromptScores:
    """Scores of one prompt from its ``[L - 1, V]`` prefill logits (positions 1 .. L - 1)."""
    lps_T_V = torch.log_softmax(logits_T_V.float(), dim=-1)
    scores = PromptScores()
    if params.topk_prompt_logprobs:
        k = min(params.topk_prompt_logprobs, lps_T_V.shape[-1])
        top = torch.topk(lps_T_V, k, dim=-1)
        rows = [None, *_pairs(top.indices, top.values)]
        scores.topk = blank_before_last_n(rows, params.prompt_logprobs_last_n)
    if params.target_prompt_token_ids is not None:
        ids_T_K = torch.tensor(params.target_prompt_token_ids, dtype=torch.long).reshape(
            lps_T_V.shape[0], -1
        )
        if ids_T_K.numel() and (int(ids_T_K.min()) < -1 or int(ids_T_K.max()) >= vocab):
            raise InvalidArgumentError(f"target_prompt_token_ids must be -1 or in [0, {vocab})")
        picked = lps_T_V.gather(1, ids_T_K.clamp(min=0).to(lps_T_V.device)).cpu()
        scores.targets = torch.where(ids_T_K >= 0, picked, 0.0).tolist()
    if params.prompt_alt_tokens_k:
        scores.alt_tokens = _alt_tokens(logits_T_V, lps_T_V, params, seed)
    return scores


def _alt_tokens(
    logits_T_V: torch.Tensor, lps_T_V: torch.Tensor, params: SamplingParams, seed: int
) -> list[list[tuple[int, float]]]:
    k = params.prompt_alt_tokens_k
    if params.temperature == 0:
        ids_T_K = logits_T_V.argmax(dim=-1, keepdim=True).expand(-1, k)
    else:
        probs_T_V = torch.softmax(logits_T_V.float() / params.temperature, dim=-1).cpu()
        generator = torch.Generator().manual_seed((seed ^ _ALT_SEED_SALT) % (2**63 - 1))
        ids_T_K = torch.multinomial(probs_T_V, k, replacement=True, generator=generator)
    ids_T_K = ids_T_K.to(lps_T_V.device)
    return _pairs(ids_T_K, lps_T_V.gather(1, ids_T_K))


def topk_rows(lps_B_V: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """Per row, the ``k`` most likely ``(token_id, logprob)`` pairs of a ``[B, V]`` log-softmax."""
    top = torch.topk(lps_B_V, min(k, lps_B_V.shape[-1]), dim=-1)
    return _pairs(top.indices, top.values)


def _pairs(ids_T_K: torch.Tensor, lps_T_K: torch.Tensor) -> list[list[tuple[int, float]]]:
    ids, lps = ids_T_K.cpu().tolist(), lps_T_K.float().cpu().tolist()
    return [list(zip(row_ids, row_lps)) for row_ids, row_lps in zip(ids, lps)]
