"""Format reward: does the completion have the expected shape."""

from __future__ import annotations

import re

from twinkle.reward.base import Completion, Reward

THINK_ANSWER_PATTERN = r"(?=.*?<think>.*?</think>)(?=.*?<answer>.*?</answer>).*"


class FormatReward(Reward):
    """``1.0`` when the stripped completion fully matches ``pattern``, else ``0.0``.

    Args:
        pattern: A regular expression (``.`` matches newlines). The default asks for a
            ``<think>...</think>`` and an ``<answer>...</answer>`` block anywhere in the text.
            ``twinkle.rl.FormatReward`` is the same class with the default ``Answer: -?\\d+``.
    """

    default_pattern = THINK_ANSWER_PATTERN

    def __init__(self, pattern: str | None = None) -> None:
        self.pattern = re.compile(self.default_pattern if pattern is None else pattern, re.DOTALL)

    def score(self, completion: Completion) -> float:
        return float(bool(self.pattern.fullmatch(completion.text.strip())))
