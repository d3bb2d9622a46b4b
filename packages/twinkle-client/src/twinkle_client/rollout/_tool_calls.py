"""Tool calls in a completion: Qwen's (Hermes-style) ``<tool_call>{json}</tool_call>`` blocks."""

from __future__ import annotations

import json
import re
from typing import Any

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """The tool calls written in ``text``, as OpenAI-style dicts.

    Each ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block becomes
    ``{'type': 'function', 'function': {'name': ..., 'arguments': {...}}}``, in the order written.
    A block cut off at the end of the text (no closing tag) still counts when its JSON is complete.
    A block whose body is not such a JSON object is kept as a call with ``'error'`` set, so the
    tool side can answer the model with what was wrong instead of the call vanishing.

    Returns:
        The calls; empty when the text has none.
    """
    calls = []
    for body in _BLOCK.findall(text or ""):
        if not body.strip():
            continue
        calls.append(_call(body))
    return calls


def _call(body: str) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return _invalid(f"the tool call is not valid JSON ({exc.msg} at position {exc.pos})")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return _invalid('the tool call must be a JSON object with a "name" string')
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return _invalid('"arguments" is a string that is not a JSON object', payload["name"])
    if not isinstance(arguments, dict):
        return _invalid('"arguments" must be a JSON object', payload["name"])
    return {"type": "function", "function": {"name": payload["name"], "arguments": arguments}}


def _invalid(reason: str, name: str = "") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": {}}, "error": reason}
