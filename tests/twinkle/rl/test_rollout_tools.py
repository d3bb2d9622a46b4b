"""Tool-call parsing (``twinkle_client.rollout.parse_tool_calls``), ``ToolManager`` and
``EnvTool`` from ``twinkle_agentic``."""

from __future__ import annotations

import pytest

from twinkle_agentic.envs import Env, EnvTool, OpenEnv, StepResult, observation_text
from twinkle_agentic.tools import Tool, ToolManager
from twinkle_client.rollout import parse_tool_calls


def test_qwen_tool_call_blocks_become_openai_calls_in_order():
    text = (
        'I will hit.\n<tool_call>\n{"name": "play", "arguments": {"action": "hit"}}\n'
        '</tool_call>\n<tool_call>{"name": "log", "arguments": "{\\"n\\": 2}"}</tool_call>'
    )
    assert parse_tool_calls(text) == [
        {"type": "function", "function": {"name": "play", "arguments": {"action": "hit"}}},
        {"type": "function", "function": {"name": "log", "arguments": {"n": 2}}},
    ]


def test_text_without_a_tool_call_has_none_and_an_unclosed_complete_block_counts():
    assert parse_tool_calls("I stand.") == []
    assert parse_tool_calls("") == []
    assert parse_tool_calls('<tool_call>{"name": "play"}') == [
        {"type": "function", "function": {"name": "play", "arguments": {}}}
    ]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("{not json", "the tool call is not valid JSON"),
        ('["play"]', 'the tool call must be a JSON object with a "name" string'),
        ('{"name": "play", "arguments": [1]}', '"arguments" must be a JSON object'),
        ('{"name": "play", "arguments": "x"}', '"arguments" is a string that is not a JSON object'),
    ],
)
def test_a_malformed_block_is_kept_with_its_error(body, error):
    (parsed,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed["error"].startswith(error)


class Echo(Tool):
    def __init__(self, name="echo"):
        self.name = name

    def __call__(self, tool_name, arguments):
        if arguments.get("fail"):
            raise RuntimeError("asked to fail")
        return f"{tool_name}:{sorted(arguments.items())}"

    def tool_info(self):
        return {
            "type": "function",
            "function": {"name": self.name, "description": "", "parameters": {}},
        }


def test_tool_manager_dispatches_by_name_and_answers_mistakes_with_error_text():
    manager = ToolManager([Echo("a"), Echo("b")])
    assert manager.names() == ["a", "b"]
    assert [i["function"]["name"] for i in manager.tool_infos()] == ["a", "b"]
    assert manager({"function": {"name": "b", "arguments": '{"x": 1}'}}) == "b:[('x', 1)]"
    assert manager({"name": "a", "arguments": {"y": 2}}) == "a:[('y', 2)]"
    assert manager({"function": {"name": "c"}}) == "Error: unknown tool 'c'; available tools: a, b"
    assert manager({"function": {"name": "a", "arguments": "{bad"}}).startswith(
        "Error: the arguments of 'a' are not valid JSON"
    )
    assert manager({"function": {"name": "a", "arguments": {"fail": True}}}) == (
        "Error: tool 'a' failed: RuntimeError: asked to fail"
    )
    assert manager({"function": {}}) == "Error: the tool call has no function name"
    assert manager.call_many([{"name": "a"}, {"name": "b"}]) == ["a:[]", "b:[]"]
    assert manager.done is False


def test_tool_manager_refuses_unnamed_and_duplicate_tools():
    with pytest.raises(ValueError, match="already registered"):
        ToolManager([Echo("a"), Echo("a")])
    with pytest.raises(ValueError, match="non-empty name"):
        ToolManager([Echo("")])
    with pytest.raises(TypeError, match="list of tools or a mapping"):
        ToolManager("echo")


class Dice(Env):
    """Pays each roll's value; the episode ends after two rolls."""

    def __init__(self):
        self.rolls = []

    def step(self, tool_name, arguments):
        self.rolls.append(arguments["value"])
        return StepResult(
            f"rolled {arguments['value']}", float(arguments["value"]), len(self.rolls) == 2
        )


def test_env_tool_sums_the_episode_reward_and_stops_at_the_end():
    env = Dice()
    tool = EnvTool(env, tool_name="roll", description="Roll.", parameters={"type": "object"})
    manager = ToolManager([tool])
    assert tool.tool_info() == {
        "type": "function",
        "function": {"name": "roll", "description": "Roll.", "parameters": {"type": "object"}},
    }
    assert manager({"name": "roll", "arguments": {"value": 3}}) == "rolled 3"
    assert (tool.done, tool.episode_reward, manager.done) == (False, 3.0, False)
    assert manager({"name": "roll", "arguments": {"value": 4}}) == "rolled 4"
    assert (tool.done, tool.episode_reward, manager.done) == (True, 7.0, True)
    assert manager({"name": "roll", "arguments": {"value": 6}}).startswith("The episode is over")
    assert env.rolls == [3, 4] and tool.steps == 2


def test_env_tool_from_env_makes_one_tool_per_schema():
    class TwoTools(Dice):
        def tools(self):
            return [{"function": {"name": n, "description": n}} for n in ("left", "right")]

    tools = EnvTool.from_env(TwoTools())
    assert [t.tool_name for t in tools] == ["left", "right"]
    assert [t.tool_name for t in EnvTool.from_env(Dice())] == ["env_action"]


class EchoEnvironment:
    """An OpenEnv-style environment object: ``reset``/``step`` return observations with
    ``done`` and ``reward``."""

    def __init__(self, prefix=">"):
        self.prefix, self.closed = prefix, False

    def reset(self):
        return {"text": f"{self.prefix} ready", "done": False, "reward": None}

    def step(self, action):
        return {"echoed": action["message"], "done": True, "reward": 0.5}

    def close(self):
        self.closed = True


def test_open_env_embeds_an_environment_class_and_maps_tool_calls_to_actions():
    env = OpenEnv(
        env_cls=EchoEnvironment,
        env_kwargs={"prefix": "#"},
        action_mapper=lambda name, args: {"message": f"{name}:{args['say']}"},
    )
    first = env.reset()
    assert (first.observation, first.reward, first.done) == ("# ready", 0.0, False)
    result = env.step("talk", {"say": "hi"})
    assert result.observation == '{"echoed": "talk:hi"}'
    assert (result.reward, result.done) == (0.5, True)
    env.close()
    assert env.env.closed


def test_open_env_names_what_is_missing():
    with pytest.raises(ValueError, match="env_name"):
        OpenEnv()
    with pytest.raises(ModuleNotFoundError, match="no OpenEnv environment 'no_such_env'"):
        OpenEnv(env_name="no_such_env")
    with pytest.raises(ValueError, match="'module:Class'"):
        OpenEnv(env_cls="nodots")


def test_observation_text_prefers_a_text_field():
    assert observation_text("plain") == "plain"
    assert observation_text({"content": "c", "reward": 1}) == "c"
    assert observation_text({"board": [1, 2], "done": False}) == '{"board": [1, 2]}'
    assert observation_text(None) == ""
