"""Preference (DPO) preprocessors: one row -> ``{'positive': Trajectory, 'negative': Trajectory}``.

``Dataset.encode`` encodes both trajectories of such a row, so each encoded row is
``{'positive': InputFeature, 'negative': InputFeature}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.data_format import Message, Trajectory
from twinkle.preprocessor._registry import register_preprocessor
from twinkle.preprocessor.base import MissingFieldError, Preprocessor


@register_preprocessor
class EmojiDPOProcessor(Preprocessor):
    """Rows ``{'prompt', 'answer_zh', 'answer_en'}`` (shareAI's DPO-zh-en-emoji) -> a chosen
    and a rejected conversation sharing one prompt.

    Args:
        system: Optional system prompt before the user turn.
        chosen_key: Field of the preferred answer.
        rejected_key: Field of the rejected answer.
        prompt_key: Field of the user prompt.
    """

    def __init__(
        self,
        system: str | None = None,
        chosen_key: str = "answer_zh",
        rejected_key: str = "answer_en",
        prompt_key: str = "prompt",
    ) -> None:
        self.system = system
        self.chosen_key = chosen_key
        self.rejected_key = rejected_key
        self.prompt_key = prompt_key

    def process(self, row: Mapping[str, Any]) -> dict[str, Trajectory]:
        """Build both conversations.

        Raises:
            MissingFieldError: The prompt, chosen or rejected field is missing.
        """
        for field in (self.prompt_key, self.chosen_key, self.rejected_key):
            if row.get(field) is None:
                raise MissingFieldError(field, f"missing field {field!r} needed by {self!r}")
        prompt = [Message(role="user", content=row[self.prompt_key])]
        if self.system:
            prompt.insert(0, Message(role="system", content=self.system))
        return {
            "positive": _with_answer(prompt, row[self.chosen_key]),
            "negative": _with_answer(prompt, row[self.rejected_key]),
        }

    def __repr__(self) -> str:
        return (
            f"EmojiDPOProcessor(chosen_key={self.chosen_key!r}, rejected_key={self.rejected_key!r})"
        )


def _with_answer(prompt: list[Message], answer: str) -> Trajectory:
    return Trajectory(messages=[*prompt, Message(role="assistant", content=answer)])


__all__ = ["EmojiDPOProcessor"]
