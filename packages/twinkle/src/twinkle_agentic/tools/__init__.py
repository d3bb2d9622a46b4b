"""Tools the model calls during a rollout, and the ``ToolManager`` that dispatches the calls."""

from twinkle_agentic.tools.base import Tool
from twinkle_agentic.tools.tool_manager import ToolManager

__all__ = ["Tool", "ToolManager"]
