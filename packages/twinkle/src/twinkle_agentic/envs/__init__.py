"""Environments the model acts on through tool calls.

``Env`` is the interface (``reset`` / ``step`` / ``close``), ``OpenEnv`` embeds an OpenEnv
environment in-process, ``EnvTool`` offers an environment's action to the model as a tool.
"""

from twinkle_agentic.envs.base import Env, StepResult
from twinkle_agentic.envs.env_tool import EnvTool
from twinkle_agentic.envs.openenv import OpenEnv, observation_text

__all__ = ["Env", "EnvTool", "OpenEnv", "StepResult", "observation_text"]
