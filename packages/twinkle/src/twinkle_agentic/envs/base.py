"""``Env``: an environment the model acts on through tool calls, and ``StepResult``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepResult:
    """What an environment answers to ``reset`` or ``step``.

    Attributes:
        observation: What the model reads next, as text.
        reward: This step's reward (0.0 when the environment gives none).
        done: Whether the episode is over.
        info: Anything else (e.g. the environment's own observation object under ``'raw'``).
    """

    observation: str = ""
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """An environment stepped by tool calls: ``reset()``, then ``step(tool_name, arguments)``
    until a result is ``done``; ``close()`` releases it (also on leaving a ``with`` block).

    Wrap it in an :class:`~twinkle_agentic.envs.EnvTool` to offer its action to the model.
    """

    def reset(self) -> StepResult:
        """Start a new episode and return its first observation."""
        return StepResult()

    @abstractmethod
    def step(self, tool_name: str, arguments: dict[str, Any]) -> StepResult:
        """Apply the action the model chose with the tool call ``tool_name(**arguments)``."""

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI-style schemas of the tools this environment understands (may be empty)."""
        return []

    def close(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Release what the environment holds."""

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
