"""Preprocessors for text datasets: math word problems (GSM8K, competition math), the Countdown
game, and (re-exported) self-cognition and Alpaca.

The RL ones build prompt-only trajectories (system + user; the answer is generated on-policy)
and put what a reward needs in ``user_data``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from twinkle.data_format import Message, Trajectory
from twinkle.preprocessor._registry import register_preprocessor
from twinkle.preprocessor.base import MissingFieldError, Preprocessor
from twinkle.preprocessor.chat import AlpacaProcessor, SelfCognitionProcessor

_GSM8K_ANSWER = re.compile(r"####\s*([-\d,.]+)")
_BOXED = re.compile(r"\\boxed\{")


def gsm8k_answer(answer: str) -> str:
    """The number after ``####`` in a GSM8K answer, without thousands separators ('' if none)."""
    match = _GSM8K_ANSWER.search(answer or "")
    return match.group(1).replace(",", "").strip() if match else ""


def boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces kept), or ``None``."""
    starts = [m.end() for m in _BOXED.finditer(text or "")]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for position in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return text[start:position]
    return None


@register_preprocessor
class GSM8KProcessor(Preprocessor):
    """GSM8K rows ``{'question', 'answer'}`` -> a system + user prompt for on-policy sampling.

    ``user_data`` is ``[('ground_truth', '<number after ####>')]``.

    Args:
        system: The system prompt (default: solve step by step, answer in ``\\boxed{}``).
        add_assistant: Also add the reference answer as an assistant turn (for SFT).
    """

    required_fields = ("question",)
    default_system = (
        "You are a careful math assistant. Reason step by step, then give the final answer "
        "as \\boxed{answer}."
    )

    def __init__(self, system: str | None = None, add_assistant: bool = False) -> None:
        self.system = self.default_system if system is None else system
        self.add_assistant = add_assistant

    def process(self, row: Mapping[str, Any]) -> Trajectory:
        """Build the prompt and record the ground truth."""
        answer = row.get("answer") or ""
        messages = [Message(role="user", content=row["question"])]
        if self.system:
            messages.insert(0, Message(role="system", content=self.system))
        if self.add_assistant:
            messages.append(Message(role="assistant", content=answer))
        return Trajectory(messages=messages, user_data=[("ground_truth", gsm8k_answer(answer))])


@register_preprocessor
class CountdownProcessor(Preprocessor):
    """Countdown rows ``{'nums', 'target'}`` -> a prompt asking for an equation that reaches the
    target, with the reasoning in ``<think>`` and the equation in ``<answer>`` tags.

    ``user_data`` is ``[{'target': target, 'nums': nums}]``. A ``response`` field, where a
    dataset has one, is read as the target.

    Args:
        system: The system prompt.
    """

    required_fields = ("nums",)
    default_system = (
        "You are a helpful assistant. You think about the reasoning first, then give the "
        "user the answer."
    )

    def __init__(self, system: str | None = None) -> None:
        self.system = self.default_system if system is None else system

    def process(self, row: Mapping[str, Any]) -> Trajectory:
        """Build the game prompt for this row's numbers and target."""
        nums = list(row["nums"])
        target = row.get("target", row.get("response"))
        if target is None:
            raise MissingFieldError("target", f"missing field 'target' needed by {self!r}")
        query = (
            f"Using the numbers {nums}, write an equation that equals {target}. Use +, -, * "
            "and / and each number at most once. Put your reasoning inside <think> </think> "
            "and the final equation inside <answer> </answer>, for example "
            "<answer> (1 + 2) / 3 * 4 = 4 </answer>."
        )
        messages = [Message(role="user", content=query)]
        if self.system:
            messages.insert(0, Message(role="system", content=self.system))
        return Trajectory(messages=messages, user_data=[{"target": target, "nums": nums}])


@register_preprocessor
class CompetitionMathProcessor(Preprocessor):
    """Competition-math rows ``{'problem', 'solution'}`` -> a user/assistant exchange (SFT)."""

    required_fields = ("problem", "solution")

    def process(self, row: Mapping[str, Any]) -> Trajectory:
        """The problem as the user turn, the worked solution as the assistant turn."""
        return Trajectory(
            messages=[
                Message(role="user", content=row["problem"]),
                Message(role="assistant", content=row["solution"]),
            ]
        )


@register_preprocessor
class CompetitionMathGRPOProcessor(Preprocessor):
    """Competition-math rows ``{'problem', 'solution'}`` -> a prompt for on-policy sampling.

    ``user_data`` holds ``('solution', <full solution>)`` and ``('ground_truth', <its last
    \\boxed{} content>)``.

    Args:
        system: The system prompt (default: answer only with ``\\boxed{...}``).
    """

    required_fields = ("problem", "solution")
    default_system = "You are a math assistant. Reply with only the final answer as \\boxed{...}."

    def __init__(self, system: str | None = None) -> None:
        self.system = self.default_system if system is None else system

    def process(self, row: Mapping[str, Any]) -> Trajectory:
        """Build the prompt and record the reference solution and its boxed answer."""
        messages = [Message(role="user", content=row["problem"])]
        if self.system:
            messages.insert(0, Message(role="system", content=self.system))
        solution = row["solution"]
        user_data = [("solution", solution), ("ground_truth", boxed_answer(solution) or "")]
        return Trajectory(messages=messages, user_data=user_data)


__all__ = [
    "AlpacaProcessor",
    "CompetitionMathGRPOProcessor",
    "CompetitionMathProcessor",
    "CountdownProcessor",
    "GSM8KProcessor",
    "SelfCognitionProcessor",
    "boxed_answer",
    "gsm8k_answer",
]
