"""What a sampling call takes (``SamplingParams``) and returns (``SampleResult`` per input).

Numpy only; ``twinkle.sampler.types`` re-exports these classes, so code written against the
local sampler reads remote results unchanged.

A result doubles as a training sample: ``SampleResult`` is a read-only mapping with ``input_ids``
(prompt + completion), ``labels`` (``-100`` on the prompt) and ``old_logprobs`` (the sampler's
log-probability of each completion token, aligned with ``input_ids``), so
``model.forward_backward(inputs=responses, advantages=...)`` trains on what ``sample`` returned.
Each sequence also carries ``new_input_feature``: that training sample plus the input's own
fields (a trajectory's messages with the reply appended, its extra data), as ModelScope Twinkle's
scripts read it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np

# The module, not the package: ``twinkle_client.data_format`` re-exports these types.
from twinkle_client.data_format._input_feature import IGNORE_INDEX, InputFeature

StopReason = Literal["stop", "length"]

# Keys of an input that a completion changes: they are rebuilt for ``new_input_feature``.
_REBUILT_KEYS = ("input_ids", "labels", "length", "attention_mask", "position_ids", "old_logprobs")


class TokenLogprob(float):
    """The log-probability of one sampled token, which also reads as its ``(token_id, logprob)``
    pairs.

    It is a ``float`` (arithmetic, ``numpy``, ``torch.tensor`` and JSON see the sampled token's
    log-prob), and ``lp[i]`` is the ``i``-th ``(token_id, logprob)`` pair at that position: the
    sampled token first, then the ``topk_logprobs`` most likely other tokens, most likely first.
    ``lp[0][1] == float(lp)``; this is the layout ModelScope Twinkle's scripts index.

    Attributes:
        pairs: The ``(token_id, logprob)`` pairs, sampled token first.
    """

    __slots__ = ("pairs",)
    pairs: tuple[tuple[int, float], ...]

    def __new__(cls, value: float, pairs: tuple[tuple[int, float], ...] = ()) -> TokenLogprob:
        self = super().__new__(cls, value)
        self.pairs = tuple((int(t), float(lp)) for t, lp in pairs)
        return self

    @property
    def token_id(self) -> int:
        """The sampled token."""
        return self.pairs[0][0]

    def __getitem__(self, index: int) -> tuple[int, float]:
        return self.pairs[index]

    def __len__(self) -> int:
        return len(self.pairs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (float(self), self.pairs))

    def __repr__(self) -> str:
        return float.__repr__(self)


def token_logprobs(
    tokens: list[int], logprobs: list[float], topk: list[list[tuple[int, float]]] | None = None
) -> list[TokenLogprob]:
    """Per token, its log-prob as a :class:`TokenLogprob` whose pairs are the sampled token and
    then ``topk``'s other tokens."""
    out = []
    for i, (token, value) in enumerate(zip(tokens, logprobs)):
        others = [(t, lp) for t, lp in (topk[i] if topk else ()) if int(t) != int(token)]
        out.append(TokenLogprob(value, ((token, value), *others)))
    return out


def use_logprob_pairs(results: list[SampleResult], params: SamplingParams) -> None:
    """Give every sequence :class:`TokenLogprob` log-probs when ``params.logprob_pairs``."""
    if not params.logprob_pairs:
        return
    for result in results:
        for seq in result.sequences:
            if seq.logprobs and len(seq.logprobs) == len(seq.tokens):
                pairs: list[Any] = token_logprobs(seq.tokens, seq.logprobs, seq.topk_logprobs)
                seq.logprobs = pairs


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; the defaults follow vLLM.

    The field names are ModelScope Twinkle's too; its forms are accepted: ``max_tokens=None`` (the
    default), ``stop`` as token ids, and ``logprobs`` / ``prompt_logprobs`` as a count ``k``.

    Attributes:
        max_tokens: Most tokens to generate per sequence; ``0`` computes prompt log-probs only;
            ``None`` is the default, 256.
        temperature: Softmax temperature; ``0`` is greedy decoding.
        top_p: Nucleus sampling mass, in ``(0, 1]``.
        top_k: Keep the ``k`` most likely tokens; ``-1`` (or 0) keeps all.
        seed: Seed of the per-sequence random generators; the same seed gives the same samples
            whatever else is in the batch. ``None`` draws seeds from torch's global RNG.
        stop: Strings that end a sequence (excluded from ``text``); a list of ints is taken as
            ``stop_token_ids``.
        stop_token_ids: Token ids that end a sequence (kept in ``tokens``); the template's
            end-of-turn token always stops.
        include_stop_str_in_output: Keep the stop string that ended a sequence in ``text``.
        logprob_pairs: Each of ``SampledSequence.logprobs`` is a :class:`TokenLogprob`, which
            also reads as the ``(token_id, logprob)`` pairs at its position, sampled token first
            (ModelScope Twinkle's layout: ``lp[0][1]``); set by ``logprobs`` given as a count.
        num_samples: Sequences per input.
        repetition_penalty: > 1 discourages tokens already in the prompt or the completion.
        logprobs: Return the log-probability of each sampled token. A count ``k`` (vLLM's and
            ModelScope Twinkle's form: ``0`` is the sampled token alone) also asks for
            ``topk_logprobs=k`` and ``logprob_pairs``; ``None`` is ``False``.
        prompt_logprobs: Return the log-probability of each prompt token (``None`` at 0). A
            count ``k >= 1`` also asks for ``topk_prompt_logprobs=k``; ``None`` is ``False``.
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

    max_tokens: int | None = 256
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
    include_stop_str_in_output: bool = False
    logprob_pairs: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens is None:
            object.__setattr__(self, "max_tokens", 256)
        self._counts_to_topk()
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
        ids: tuple[int, ...] = tuple(int(t) for t in self.stop_token_ids or ())
        if stop and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in stop):
            ids += tuple(int(t) for t in stop)
            stop = ()
        if not all(isinstance(t, str) for t in stop):
            raise ValueError(f"stop must be strings or token ids, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", ids)
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

    def _counts_to_topk(self) -> None:
        """``logprobs`` / ``prompt_logprobs`` given as counts (``None``, ``k``) -> flags + top-k."""
        for flag, topk in (
            ("logprobs", "topk_logprobs"),
            ("prompt_logprobs", "topk_prompt_logprobs"),
        ):
            value = getattr(self, flag)
            if value is None:
                object.__setattr__(self, flag, False)
            elif not isinstance(value, bool):
                if not isinstance(value, numbers.Integral) or int(value) < 0:
                    raise ValueError(f"{flag} must be a bool or an integer >= 0, got {value!r}")
                # vLLM's count: 0 is the sampled token alone; prompt_logprobs=0 is the prompt's own.
                object.__setattr__(self, flag, True)
                if flag == "logprobs":
                    object.__setattr__(self, "logprob_pairs", True)
                if int(value) > 0 and isinstance(getattr(self, topk), int):
                    object.__setattr__(self, topk, max(int(value), getattr(self, topk)))

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> SamplingParams:
        """Params from a dict of fields; ``max_new_tokens`` is read as ``max_tokens``.

        Raises:
            ValueError: On an unknown key or an invalid value.
        """
        value = dict(value)
        if "max_new_tokens" in value and "max_tokens" not in value:
            value["max_tokens"] = value.pop("max_new_tokens")
        return cls.coerce(value)

    @classmethod
    def coerce(cls, value: Any) -> SamplingParams:
        """``None`` -> defaults; a dict, or another params object with these field names (such
        as a dataclass or pydantic model of ModelScope Twinkle's), -> validated params.

        Raises:
            ValueError: On an unknown key or an invalid value.
            TypeError: If ``value`` is neither params, a mapping nor ``None``.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in fields(value)}
        elif hasattr(value, "model_dump"):
            value = value.model_dump()
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
            penalties), one per token; empty when ``logprobs=False``. With ``logprob_pairs``
            each is a :class:`TokenLogprob`: a float that also reads as the
            ``(token_id, logprob)`` pairs at its position (``lp[0][1]`` is the sampled token's).
        stop_reason: ``'stop'`` (stop token or string) or ``'length'`` (``max_tokens`` reached).
        text: The decoded completion, special tokens and the stop string left out (``decoded``
            is the same).
        topk_logprobs: Per generated token, the ``topk_logprobs`` most likely
            ``(token_id, logprob)`` pairs, most likely first; ``None`` when not asked for.
        new_input_feature: The prompt and this completion as a training sample (see
            :func:`sequence_feature`); set by the :class:`SampleResult` that holds the sequence.
    """

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    text: str = ""
    topk_logprobs: list[list[tuple[int, float]]] | None = None
    new_input_feature: InputFeature | None = field(default=None, repr=False, compare=False)

    @property
    def decoded(self) -> str:
        """The decoded completion (``text``), under ModelScope Twinkle's name."""
        return self.text

    def get(self, key: str, default: Any = None) -> Any:
        """``getattr(self, key)`` for a field (or ``decoded``), else ``default``: reads a
        sequence the way scripts that treat it as a dict do."""
        if key == "decoded" or key in {f.name for f in fields(self)}:
            value = getattr(self, key)
            return default if value is None else value
        return default


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


def sequence_feature(
    prompt_tokens: list[int], sequence: SampledSequence, input_fields: Mapping[str, Any]
) -> InputFeature:
    """``sequence``'s ``new_input_feature``: :func:`training_feature` plus the input's own fields.

    Every field of the input except its token ids rides along (copied), so a reward reads the
    sample as it read the input; ``messages``, when the input had them, gains the reply as an
    ``assistant`` message (its ``text``); an input without messages (token ids) gets that reply
    as its only message.
    """
    feature = training_feature(prompt_tokens, sequence)
    for key, value in input_fields.items():
        if key not in _REBUILT_KEYS:
            feature[key] = copy.deepcopy(value)
    reply = {"role": "assistant", "content": sequence.text}
    if isinstance(feature.get("messages"), list):
        feature["messages"].append(reply)
    else:  # an encoded prompt: the reply alone, so a reward reads the completion as text
        feature["messages"] = [reply]
    return InputFeature(feature)


def input_fields(item: Any) -> dict[str, Any]:
    """The fields of one sampler input other than its token ids: a trajectory's (messages as
    dicts), a feature's extra keys; ``{}`` for a bare list of token ids."""
    if hasattr(item, "model_dump"):
        item = item.model_dump()
    if not isinstance(item, Mapping):
        return {}
    fields_ = {str(k): v for k, v in item.items() if k not in _REBUILT_KEYS}
    messages = fields_.get("messages")
    if isinstance(messages, (list, tuple)):
        fields_["messages"] = [
            m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m)
            for m in messages
        ]
    return fields_


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
        input_fields: The input's fields other than its token ids (see :func:`input_fields`);
            every sequence's ``new_input_feature`` carries them.
    """

    prompt_tokens: list[int]
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    topk_prompt_logprobs: list[list[tuple[int, float]] | None] | None = None
    target_prompt_logprobs: list[list[float]] | None = None
    prompt_alt_tokens: list[list[tuple[int, float]]] | None = None
    input_fields: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for seq in self.sequences:
            seq.new_input_feature = sequence_feature(self.prompt_tokens, seq, self.input_fields)

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt (``prompt_tokens``), under ModelScope Twinkle's name."""
        return self.prompt_tokens

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

    def get(self, key: str, default: Any = None) -> Any:
        """``sequences`` for ``'sequences'``, else ``default``: reads the response the way
        scripts that treat it as one dict do."""
        return self.sequences if key == "sequences" else default

    @property
    def sequences(self) -> list[SampledSequence]:
        """All sequences, input by input (each input's ``num_samples`` are contiguous)."""
        return [seq for result in self for seq in result.sequences]

    def features(self) -> list[InputFeature]:
        """One training sample per sequence, in the order of :attr:`sequences`."""
        return [feature for result in self for feature in result.features()]
