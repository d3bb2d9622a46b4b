"""The tokens between two completions: the end of the assistant turn, the tool results and the
next generation prompt, in the chat template's own text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Stand-in history for templates whose rendering of earlier turns changes when messages are
# appended: one user turn renders the same either way.
_ANCHOR = [{"role": "user", "content": "x"}]


def bridge_token_ids(
    template: Any,
    messages: list[dict[str, Any]],
    new_messages: list[dict[str, Any]],
    tools: list[Any],
    sampled: Sequence[int],
) -> list[int]:
    """Token ids to append after a completion so the model continues after ``new_messages``.

    The text is the difference between the template's rendering of the conversation with
    ``new_messages`` (and a generation prompt) and without them. When the completion did not end
    with the end-of-turn token (it stopped on a stop string), that token is added here, untrained,
    and so is whatever the template writes after it (ChatML's newline).

    Args:
        template: The chat template (``render``, ``tokenizer``, ``eos_token_id``, ``decode``).
        messages: The conversation so far, ending with the sampled assistant turn.
        new_messages: The messages that follow it (tool results).
        tools: The trajectory's tool definitions, rendered as the template renders them.
        sampled: The completion's token ids.

    Raises:
        RuntimeError: The template's rendering does not extend by appending messages.
    """
    before = template.render({"messages": messages, "tools": tools})
    after = template.render(
        {"messages": messages + new_messages, "tools": tools}, add_generation_prompt=True
    )
    if not after.startswith(before):
        before = template.render({"messages": _ANCHOR})
        after = template.render({"messages": _ANCHOR + new_messages}, add_generation_prompt=True)
        if not after.startswith(before):
            raise RuntimeError(
                f"{type(template).__name__} renders earlier turns differently once messages are "
                "appended, so the tokens between two turns cannot be computed"
            )
    eos_id = template.eos_token_id
    end_of_turn = template.decode([eos_id])
    closing = (
        before[before.rfind(end_of_turn) + len(end_of_turn) :] if end_of_turn in before else ""
    )
    if not sampled or int(sampled[-1]) != eos_id:
        closing = end_of_turn + closing
    text = closing + after[len(before) :]
    return list(template.tokenizer.encode(text, add_special_tokens=False))
