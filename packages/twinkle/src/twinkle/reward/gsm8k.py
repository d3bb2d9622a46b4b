"""GSM8K rewards: the final answer after ``####`` or in ``\\boxed{}``."""

from __future__ import annotations

import re

from twinkle.reward.base import Completion, Reward
from twinkle.reward.math_reward import as_number, boxed_answer, reference_answer

_HASH_ANSWER = re.compile(r"####\s*([\-\d,.\s]+)")
_HAS_HASH_ANSWER = re.compile(r"####\s*[\-\d,.]+")
_TAIL_CHARS = 500


def gsm8k_answer(completion: str) -> str:
    """The answer of a completion: its last ``\\boxed{}`` (preferred) or its last ``#### n``,
    looked for in the last 500 characters; ``''`` when there is none."""
    tail = completion[-_TAIL_CHARS:]
    boxed = boxed_answer(tail)
    if boxed:
        return boxed.replace(",", "").replace(" ", "")
    found = _HASH_ANSWER.findall(tail)
    return found[-1].replace(",", "").replace(" ", "").strip() if found else ""


class GSM8KAccuracyReward(Reward):
    """``1.0`` when the completion's answer equals the ground truth (by value, within 1e-5; as
    text when either is not a number), else ``0.0``, also when there is no ground truth.

    The ground truth is the call's ``ground_truths`` entry, else the sample's ``ground_truth``
    (what ``GSM8KProcessor`` stores) or ``answer`` (a raw GSM8K answer ending in ``#### n``).
    """

    def score(self, completion: Completion) -> float:
        reference = completion.reference
        for key in ("ground_truth", "answer"):
            if reference is None:
                reference = completion.data.get(key)
        predicted = gsm8k_answer(completion.text)
        if reference is None or not predicted:
            return 0.0
        expected = reference_answer(reference).replace(",", "")
        got, want = as_number(predicted), as_number(expected)
        if got is not None and want is not None:
            return float(abs(got - want) < 1e-5)
        return float(predicted == expected)


class GSM8KFormatReward(Reward):
    """``1.0`` when the completion states an answer (a non-empty ``\\boxed{}`` or ``#### n``)."""

    def score(self, completion: Completion) -> float:
        text = completion.text
        return float(bool(boxed_answer(text)) or bool(_HAS_HASH_ANSWER.search(text)))
