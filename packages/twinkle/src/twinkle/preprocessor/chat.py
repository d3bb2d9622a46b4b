"""Preprocessors for common dataset layouts: self-cognition, Alpaca, and ready-made messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.preprocessor._registry import register_preprocessor
from twinkle.preprocessor.base import MissingFieldError, Preprocessor

_MESSAGE_FIELDS = ("role", "content")


def _turns(user: str, assistant: str, system: str | None = None) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"messages": messages}


@register_preprocessor
class SelfCognitionProcessor(Preprocessor):
    """Rows ``{'query', 'response'}`` -> a user/assistant exchange with the identity filled in.

    ``{{NAME}}`` and ``{{AUTHOR}}`` in either field become ``model_name`` and ``model_author``,
    so one dataset teaches any model its own name. A row with an ``image`` (a path, base64 or
    data URI, as ``ImagePart`` takes it) puts the image before the query; every message of such a
    row then holds its content as a list of parts, so that the rows of one dataset share one
    column type.

    Args:
        model_name: What the assistant calls itself.
        model_author: Who the assistant says built it.
        system: Optional system prompt put before each exchange.
    """

    required_fields = ("query", "response")

    def __init__(self, model_name: str, model_author: str, system: str | None = None) -> None:
        self.model_name = model_name
        self.model_author = model_author
        self.system = system

    def _fill(self, text: str) -> str:
        return text.replace("{{NAME}}", self.model_name).replace("{{AUTHOR}}", self.model_author)

    def process(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Fill the placeholders and return the trajectory dict."""
        turns = _turns(self._fill(row["query"]), self._fill(row["response"]), self.system)
        if row.get("image") is not None:
            for message in turns["messages"]:
                message["content"] = [{"type": "text", "text": message["content"]}]
            turns["messages"][-2]["content"].insert(0, {"type": "image", "image": row["image"]})
        return turns

    def __repr__(self) -> str:
        return f"SelfCognitionProcessor({self.model_name!r}, {self.model_author!r})"


@register_preprocessor
class AlpacaProcessor(Preprocessor):
    """Alpaca rows ``{'instruction', 'input', 'output'}`` -> a user/assistant exchange.

    A non-empty ``input`` is appended to the instruction after a blank line, as in the Alpaca
    prompt format.

    Args:
        system: Optional system prompt put before each exchange.
    """

    required_fields = ("instruction", "output")

    def __init__(self, system: str | None = None) -> None:
        self.system = system

    def process(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Join instruction and input into the user turn; ``output`` is the assistant turn."""
        prompt = row["instruction"]
        if row.get("input"):
            prompt = f"{prompt}\n\n{row['input']}"
        return _turns(prompt, row["output"], self.system)


@register_preprocessor
class MessagesProcessor(Preprocessor):
    """Rows that already hold ``messages`` pass through, checked and trimmed to known keys.

    Each message keeps ``role``, ``content`` and ``reasoning_content``; an ``extra`` dict on the
    row is kept too.
    """

    required_fields = ("messages",)

    def process(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Validate each message's fields and return the trajectory dict."""
        messages = []
        for position, message in enumerate(row["messages"]):
            for field in _MESSAGE_FIELDS:
                if message.get(field) is None:
                    raise MissingFieldError(
                        field, f"missing field {field!r} in messages[{position}]"
                    )
            messages.append(
                {
                    "role": message["role"],
                    "content": message["content"],
                    "reasoning_content": message.get("reasoning_content"),
                }
            )
        out: dict[str, Any] = {"messages": messages}
        if row.get("extra"):
            out["extra"] = row["extra"]
        return out
