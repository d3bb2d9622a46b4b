"""``EnvTool``: an environment's action offered to the model as one tool."""

from __future__ import annotations

from typing import Any

from twinkle_agentic.envs.base import Env, StepResult
from twinkle_agentic.tools.base import Tool

_ANY_ARGUMENTS = {"type": "object", "properties": {}}


class EnvTool(Tool):
    """A tool whose call steps an environment; the observation is the tool's answer.

    It keeps the episode's bookkeeping: ``episode_reward`` sums the rewards of the steps it made
    (the reward to train on, for environments that pay at the end), ``done`` turns true on the
    step that ends the episode, and ``last_result`` is the latest :class:`StepResult`. A call
    after the end does not step the environment; it answers that the episode is over.

    Args:
        env: The environment (already ``reset``).
        tool_name: The name the model calls.
        description: What the tool does, for the model.
        parameters: JSON schema of the arguments (default: any object).
    """

    def __init__(
        self,
        env: Env,
        tool_name: str = "env_action",
        description: str = "Execute an action in the environment.",
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self.env = env
        self.tool_name = tool_name
        self.description = description
        self.parameters = parameters or dict(_ANY_ARGUMENTS)
        self.last_result: StepResult | None = None
        self.episode_reward = 0.0
        self.steps = 0

    def __call__(self, tool_name: str, arguments: dict[str, Any]) -> str:
        if self.done:
            return "The episode is over: no further actions are accepted."
        result = self.env.step(tool_name, arguments)
        self.last_result = result
        self.episode_reward += float(result.reward or 0.0)
        self.steps += 1
        return result.observation

    @property
    def done(self) -> bool:
        """Whether the last step ended the episode."""
        return bool(self.last_result is not None and self.last_result.done)

    def tool_info(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.tool_name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    @classmethod
    def from_env(cls, env: Env) -> list[EnvTool]:
        """One tool per schema in ``env.tools()`` (one generic tool when it lists none)."""
        tools = []
        for info in env.tools():
            function = info.get("function", {})
            tools.append(
                cls(
                    env,
                    tool_name=function.get("name", "env_action"),
                    description=function.get("description", ""),
                    parameters=function.get("parameters"),
                )
            )
        return tools or [cls(env)]
