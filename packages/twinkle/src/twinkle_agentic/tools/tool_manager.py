"""``ToolManager``: the tools of one trajectory, answering the model's tool calls by name."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from twinkle_agentic.tools.base import Tool


class ToolManager:
    """Tools by name; calling the manager with a tool call runs the named tool.

    A call that cannot run (an unknown name, arguments that are not a JSON object, a tool that
    raises) is answered with an ``Error: ...`` text rather than an exception: the model reads
    the answer as its tool result and can correct itself on the next turn.

    Args:
        tools: Tools (each named by its ``tool_info()['function']['name']``), a mapping of
            name to tool, or ``None``.

    Raises:
        ValueError: A tool without a name, or two tools with the same name.
        TypeError: ``tools`` is neither a mapping nor an iterable of tools.
    """

    def __init__(self, tools: Iterable[Tool] | Mapping[str, Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        if tools is None:
            return
        if isinstance(tools, Mapping):
            self._tools.update(tools)
            return
        if isinstance(tools, (str, bytes)) or not isinstance(tools, Iterable):
            raise TypeError(
                f"tools must be a list of tools or a mapping, got {type(tools).__name__}"
            )
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Add ``tool`` under its schema's name.

        Raises:
            ValueError: The tool's schema has no name, or the name is taken.
        """
        name = _schema_name(tool)
        if name in self._tools:
            raise ValueError(f"a tool named {name!r} is already registered")
        self._tools[name] = tool

    def names(self) -> list[str]:
        """The registered tool names, in registration order."""
        return list(self._tools)

    def tool_infos(self) -> list[dict[str, Any]]:
        """The OpenAI-style schemas of all tools, for a trajectory's ``tools``."""
        return [tool.tool_info() for tool in self._tools.values()]

    @property
    def done(self) -> bool:
        """Whether a tool reports that its episode is over (an ``EnvTool`` whose environment
        finished): a rollout stops the trajectory then."""
        return any(bool(getattr(tool, "done", False)) for tool in self._tools.values())

    def __call__(self, tool_call: Mapping[str, Any]) -> str:
        """Run one tool call and return the text the model reads back.

        Args:
            tool_call: ``{'function': {'name': ..., 'arguments': {...} or '<json>'}}`` (OpenAI's
                shape, as ``twinkle_client.rollout.parse_tool_calls`` returns) or
                ``{'name': ..., 'arguments': ...}``.
        """
        name, arguments, error = _unpack(tool_call)
        if error:
            return f"Error: {error}"
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return f"Error: unknown tool {name!r}; available tools: {known}"
        try:
            return str(tool(name, arguments))
        except Exception as exc:  # the model reads the failure as the tool's answer
            return f"Error: tool {name!r} failed: {type(exc).__name__}: {exc}"

    def call_many(self, tool_calls: Iterable[Mapping[str, Any]]) -> list[str]:
        """Run tool calls one after another, in order (environments are rarely thread-safe)."""
        return [self(call) for call in tool_calls]


def _schema_name(tool: Any) -> str:
    info = tool.tool_info() if hasattr(tool, "tool_info") else None
    function = info.get("function") if isinstance(info, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"{type(tool).__name__}: tool_info() must give {{'function': {{'name': ...}}}} "
            "with a non-empty name"
        )
    return name


def _unpack(tool_call: Any) -> tuple[str, dict[str, Any], str | None]:
    """``(name, arguments, error)`` of a tool call in either accepted shape."""
    if not isinstance(tool_call, Mapping):
        return "", {}, f"a tool call must be an object, got {type(tool_call).__name__}"
    if tool_call.get("error"):
        return "", {}, str(tool_call["error"])
    function = tool_call.get("function", tool_call)
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        return "", {}, "the tool call has no function name"
    arguments = function.get("arguments")
    if arguments is None:
        return name, {}, None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return name, {}, f"the arguments of {name!r} are not valid JSON ({exc.msg})"
    if not isinstance(arguments, Mapping):
        return name, {}, f"the arguments of {name!r} must be a JSON object"
    return name, dict(arguments), None
