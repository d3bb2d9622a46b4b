"""Rule-based rewards on sampled completions.

A reward is called with what ``Sampler.sample`` returned (a ``SampleResponse`` or a list of
``SampleResult``) or with plain completion strings, and returns one float per sequence, in the
order of ``SampleResponse.sequences``. References (e.g. the right answer) come from each input's
``Trajectory.extra`` or are passed per input.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _completions(samples: Any, references: Sequence[Any] | None, key: str) -> list[tuple[str, Any]]:
    """``(text, reference)`` per sequence; a per-input reference is repeated for its samples."""
    samples = list(samples)
    if references is not None and len(references) != len(samples):
        raise ValueError(f"{len(references)} references for {len(samples)} inputs")
    pairs = []
    for i, item in enumerate(samples):
        if isinstance(item, str):
            texts, extra = [item], {}
        else:
            texts, extra = [seq.text for seq in item.sequences], item.extra
        reference = references[i] if references is not None else extra.get(key)
        pairs.extend((text, reference) for text in texts)
    return pairs


class FormatReward:
    """``1.0`` when the completion (stripped) fully matches ``pattern``, else ``0.0``.

    Args:
        pattern: A regular expression; the default accepts ``Answer: <integer>``.
    """

    def __init__(self, pattern: str = r"Answer: -?\d+") -> None:
        self.pattern = re.compile(pattern, re.DOTALL)

    def __call__(self, samples: Any, references: Sequence[Any] | None = None) -> np.ndarray:
        samples = list(samples)
        pairs = _completions(
            samples, [None] * len(samples) if references is None else references, ""
        )
        return np.asarray(
            [float(bool(self.pattern.fullmatch(t.strip()))) for t, _ in pairs], dtype=np.float32
        )


def final_number(text: str) -> str | None:
    """The last number in ``text`` (``'-3'``, ``'2.5'``), or ``None``."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


class MathReward:
    """``1.0`` when the completion's final number equals the reference answer, else ``0.0``.

    Numbers compare by value (``'4'`` equals ``'4.0'``). The reference is each input's
    ``extra[answer_key]`` unless ``references`` are given.

    Args:
        answer_key: Key of the reference answer in ``Trajectory.extra``.
    """

    def __init__(self, answer_key: str = "answer") -> None:
        self.answer_key = answer_key

    def __call__(self, samples: Any, references: Sequence[Any] | None = None) -> np.ndarray:
        rewards = []
        for text, reference in _completions(samples, references, self.answer_key):
            if reference is None:
                raise ValueError(
                    f"no reference answer: pass references= or set extra[{self.answer_key!r}]"
                )
            got = final_number(text)
            rewards.append(float(got is not None and float(got) == float(reference)))
        return np.asarray(rewards, dtype=np.float32)
