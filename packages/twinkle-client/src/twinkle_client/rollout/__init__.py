"""Multi-turn agentic rollouts from the client: the policy samples on the server, the tools and
environments it acts on run in the script's process.

``ClientMultiTurnRollout`` works with any tool manager that is callable with an OpenAI-style
tool call (``twinkle_agentic.tools.ToolManager`` is one) and any chat template object with
``encode`` / ``render`` (``twinkle.template``'s); this package itself imports neither.
"""

from twinkle_client.rollout._result import RolloutTrajectory
from twinkle_client.rollout._tool_calls import parse_tool_calls
from twinkle_client.rollout.multi_turn import ClientMultiTurnRollout

__all__ = ["ClientMultiTurnRollout", "RolloutTrajectory", "parse_tool_calls"]
