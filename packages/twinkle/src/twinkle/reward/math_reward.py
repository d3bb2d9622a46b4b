"""Final-answer rewards for math: the answer is a ``\\boxed{...}`` or the last number."""

from __future__ import annotations

import re
from typing import Any

from twinkle.errors import InvalidArgumentError
from twinkle.reward.base import Completion, Reward

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_PLAIN_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_REFERENCE_KEYS = ("ground_truth", "solution")


def final_number(text: str) -> str | None:
    """The last number in ``text`` (``'-3'``, ``'2.5'``), or ``None``."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces allowed), or ``None``."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def reference_answer(reference: Any) -> str:
    """The answer inside a reference: its ``\\boxed{}``, what follows ``####`` or
    ``# Answer``, else the whole text."""
    text = str(reference)
    boxed = boxed_answer(text)
    if boxed is not None:
        return boxed
    for marker in ("####", "# Answer"):
        if marker in text:
            return text.rsplit(marker, 1)[1].strip()
    return text.strip()


def as_number(text: str) -> float | None:
    """``text`` as a number when it is one (``'1,000'``, ``'$4'``, ``'2.50'``), else ``None``."""
    cleaned = _THOUSANDS.sub("", text).strip().strip("$").strip()
    return float(cleaned) if _PLAIN_NUMBER.fullmatch(cleaned) else None


def _normalise(text: str) -> str:
    text = re.sub(r"\\left|\\right|\\!|\$|\s", "", text)
    return text.rstrip(".")


def answers_match(completion: str, reference: Any) -> bool:
    """Whether the completion's final answer equals the reference's.

    A numeric reference compares by value with the last number of the completion's
    ``\\boxed{}`` (or of the whole completion); any other reference compares as normalised text
    (spaces, ``$``, ``\\left``/``\\right`` dropped) with the ``\\boxed{}`` content.
    """
    expected = reference_answer(reference)
    source = boxed_answer(completion)
    source = completion if source is None else source
    value = as_number(expected)
    if value is not None:
        got = final_number(_THOUSANDS.sub("", source))
        return got is not None and abs(float(got) - value) <= 1e-6 * max(1.0, abs(value))
    return _normalise(source) == _normalise(expected)


class MathReward(Reward):
    """``1.0`` when the completion's final answer equals the reference answer, else ``0.0``.

    Numbers compare by value (``'4'`` equals ``'4.0'``), other answers as normalised text (see
    :func:`answers_match`). The reference is, in order: the call's ``ground_truths`` /
    ``references`` entry, the sample's ``answer_key`` (``extra`` or upstream ``user_data``), its
    ``ground_truth`` or its ``solution``.

    Args:
        answer_key: Key of the reference answer in the per-sample data.

    Raises:
        InvalidArgumentError: (at call time) a completion without any reference.
    """

    def __init__(self, answer_key: str = "answer") -> None:
        self.answer_key = answer_key

    def __call__(self, trajectories: Any, ground_truths: Any = None, **kwargs: Any):
        references = kwargs.pop("references", None)
        if kwargs:
            raise InvalidArgumentError(f"MathReward got unexpected arguments {sorted(kwargs)}")
        return super().__call__(trajectories, ground_truths if references is None else references)

    def score(self, completion: Completion) -> float:
        reference = completion.reference
        for key in (self.answer_key, *_REFERENCE_KEYS):
            if reference is None:
                reference = completion.data.get(key)
        if reference is None:
            raise InvalidArgumentError(
                f"no reference answer: pass ground_truths= (or references=) or set "
                f"extra[{self.answer_key!r}]"
            )
        return float(answers_match(completion.text, reference))
