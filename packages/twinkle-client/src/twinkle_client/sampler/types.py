"""What a sampling call takes (``SamplingParams``) and returns (``SampleResult`` per input).

Numpy only; ``twinkle.sampler.types`` re-exports these classes, so code written against the
local sampler reads remote results unchanged.

A result doubles as a training sample: ``SampleResult`` is a read-only mapping with ``input_ids``
(prompt + completion), ``labels`` (``-100`` on the prompt) and ``old_logprobs`` (the sampler's
log-probability of each completion token, aligned with ``input_ids``), so
``model.forward_backward(inputs=responses, advantages=...)`` trains on what ``sample`` returned.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np

from twinkle_client.data_format import IGNORE_INDEX, InputFeature

StopReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; the defaults follow vLLM.

    Attributes:
        max_tokens: Most tokens to generate per sequence; ``0`` computes prompt log-probs only.
        temperature: Softmax temperature; ``0`` is greedy decoding.
        top_p: Nucleus sampling mass, in ``(0, 1]``.
        top_k: Keep the ``k`` most likely tokens; ``-1`` (or 0) keeps all.
        seed: Seed of the per-sequence random generators; the same seed gives the same samples
            whatever else is in the batch. ``None`` draws seeds from torch's global RNG.
        stop: Strings that end a sequence (excluded from ``text``).
        stop_token_ids: Token ids that end a sequence (kept in ``tokens``); the template's
            end-of-turn token always stops.
        num_samples: Sequences per input.
        repetition_penalty: > 1 discourages tokens already in the prompt or the completion.
        logprobs: Return the log-probability of each sampled token.
        prompt_logprobs: Return the log-probability of each prompt token (``None`` at 0).
        topk_logprobs: With ``k > 0``, the ``k`` most likely tokens and their log-probs at every
            generated position (``SampledSequence.topk_logprobs``).
        topk_prompt_logprobs: With ``k > 0``, the same at every prompt position
            (``SampleResult.topk_prompt_logprobs``).
        prompt_logprobs_last_n: Score only the last ``n`` prompt tokens (prompt and top-k prompt
            log-probs are ``None`` before them); ``1 <= n <= len(prompt) - 1``.
        prompt_alt_tokens_k: With ``k > 0``, ``k`` independent draws (at ``temperature``) from
            the next-token distribution at every prompt position after the first
            (``SampleResult.prompt_alt_tokens``).
        target_prompt_token_ids: Rows of token ids whose log-probs to return, row ``i`` scored at
            prompt position ``i + 1`` (``-1`` asks for nothing); every input must then have
            ``len(rows) + 1`` tokens (``SampleResult.target_prompt_logprobs``).

    Raises:
        ValueError: On a negative ``max_tokens`` or ``temperature``, ``top_p`` outside
            ``(0, 1]``, ``num_samples < 1`` or a non-positive ``repetition_penalty``.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    num_samples: int = 1
    repetition_penalty: float = 1.0
    logprobs: bool = True
    prompt_logprobs: bool = False
    topk_logprobs: int = 0
    topk_prompt_logprobs: int = 0
    prompt_logprobs_last_n: int | None = None
    prompt_alt_tokens_k: int = 0
    target_prompt_token_ids: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.target_prompt_token_ids is not None:
            rows = tuple(tuple(int(t) for t in row) for row in self.target_prompt_token_ids)
            object.__setattr__(self, "target_prompt_token_ids", rows)
        for name in ("topk_logprobs", "topk_prompt_logprobs", "prompt_alt_tokens_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        last_n = self.prompt_logprobs_last_n
        if last_n is not None and (not isinstance(last_n, int) or last_n < 1):
            raise ValueError(f"prompt_logprobs_last_n must be an integer >= 1, got {last_n!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids or ()))
        if (
            not isinstance(self.max_tokens, int)
            or isinstance(self.max_tokens, bool)
            or self.max_tokens < 0
        ):
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        for name in ("temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            # NaN passes every comparison below; an infinite temperature samples garbage.
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1, got {self.num_samples!r}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")

    @classmethod
    def coerce(cls, value: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
        """``None`` -> defaults; a dict -> validated params.

        Raises:
            ValueError: On an unknown key or an invalid value.
            TypeError: If ``value`` is neither params, a mapping nor ``None``.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"sampling_params must be a mapping, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(value))


@dataclass
class SampledSequence:
    """One generated completion.

    Attributes:
        tokens: Generated token ids (a stop token, when one ended the sequence, included).
        logprobs: ``log p(token)`` under the sampled model (raw logits, before temperature and
            penalties), one per token; empty when ``logprobs=False``.
        stop_reason: ``'stop'`` (stop token or string) or ``'length'`` (``max_tokens`` reached).
        text: The decoded completion, special tokens and the stop string left out.
        topk_logprobs: Per generated token, the ``topk_logprobs`` most likely
            ``(token_id, logprob)`` pairs, most likely first; ``None`` when not asked for.
    """

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    text: str = ""
    topk_logprobs: list[list[tuple[int, float]]] | None = None


def training_feature(prompt_tokens: list[int], sequence: SampledSequence) -> InputFeature:
    """A training sample from a prompt and one of its completions.

    Prompt tokens are labelled ``-100``, completion tokens with themselves; ``old_logprobs`` is
    aligned with ``input_ids`` (0 on the prompt), the layout ``forward_backward`` shifts like labels;
    it is left out when the sequence has no log-probs (the loss then treats the rollout as on-policy).
    """
    prompt = list(prompt_tokens)
    tokens = list(sequence.tokens)
    feature = InputFeature(input_ids=prompt + tokens, labels=[IGNORE_INDEX] * len(prompt) + tokens)
    if tokens and len(sequence.logprobs) == len(tokens):
        feature["old_logprobs"] = np.asarray(
            [0.0] * len(prompt) + list(sequence.logprobs), dtype=np.float32
        )
    return feature


@dataclass
class SampleResult(Mapping):
    """The samples of one input.

    With one sequence it is also that sequence's training sample (a mapping with ``input_ids``,
    ``labels``, ``old_logprobs``); with several, use :meth:`features`.

    Attributes:
        prompt_tokens: The prompt as the model saw it.
        sequences: ``num_samples`` completions.
        prompt_logprobs: Per prompt token (``None`` at position 0) when asked for, else ``None``.
        extra: The input's ``Trajectory.extra`` (e.g. a reference answer for a reward).
        topk_prompt_logprobs: Per prompt token, its ``topk_prompt_logprobs`` most likely
            ``(token_id, logprob)`` pairs, ``None`` where not scored (position 0, before the
            last ``n``); ``None`` when not asked for.
        target_prompt_logprobs: Per row of ``target_prompt_token_ids``, the log-prob of each id
            (``0.0`` where the id is ``-1``); ``None`` when not asked for.
        prompt_alt_tokens: Per prompt position after the first, ``prompt_alt_tokens_k`` drawn
            ``(token_id, logprob)`` pairs; ``None`` when not asked for.
    """

    prompt_tokens: list[int]
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    topk_prompt_logprobs: list[list[tuple[int, float]] | None] | None = None
    target_prompt_logprobs: list[list[float]] | None = None
    prompt_alt_tokens: list[list[tuple[int, float]]] | None = None

    def features(self) -> list[InputFeature]:
        """One training sample per sequence (see :func:`training_feature`)."""
        return [training_feature(self.prompt_tokens, seq) for seq in self.sequences]

    def _single(self) -> InputFeature:
        if len(self.sequences) != 1:
            raise ValueError(
                f"this result holds {len(self.sequences)} sequences, so it is not one training "
                "sample: train on SampleResponse.features() (one row per sequence) instead"
            )
        return self.features()[0]

    @property
    def input_ids(self) -> np.ndarray:
        """Prompt + completion token ids (single-sequence results)."""
        return self["input_ids"]

    @property
    def labels(self) -> np.ndarray:
        """``-100`` on the prompt, the completion tokens after it (single-sequence results)."""
        return self["labels"]

    def __getitem__(self, key: str) -> Any:
        return self._single()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._single())

    def __len__(self) -> int:
        return len(self._single())


class SampleResponse(list):
    """What ``Sampler.sample`` returns: one :class:`SampleResult` per input, in input order."""

    @property
    def sequences(self) -> list[SampledSequence]:
        """All sequences, input by input (each input's ``num_samples`` are contiguous)."""
        return [seq for result in self for seq in result.sequences]

    def features(self) -> list[InputFeature]:
        """One training sample per sequence, in the order of :attr:`sequences`."""
        return [feature for result in self for feature in result.features()]
