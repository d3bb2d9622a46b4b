"""``Tool``: something the model can call by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Tool(ABC):
    """A callable tool with an OpenAI-style schema."""

    @abstractmethod
    def __call__(self, tool_name: str, arguments: dict[str, Any]) -> str:
        """Run the tool and return the text the model reads back."""

    @abstractmethod
    def tool_info(self) -> dict[str, Any]:
        """The tool's schema: ``{'type': 'function', 'function': {'name', 'description',
        'parameters'}}``."""
