"""``twinkle_client.rollout.ClientMultiTurnRollout`` with a scripted sampler, the tiny Qwen3.5
template, and ``twinkle_agentic`` tools over a small deterministic environment."""

from __future__ import annotations

import json

import pytest

from twinkle.template import Qwen3_5Template
from twinkle_agentic.envs import Env, EnvTool, StepResult
from twinkle_agentic.tools import ToolManager
from twinkle_client._wire import training_inputs
from twinkle_client.data_format import IGNORE_INDEX
from twinkle_client.rollout import ClientMultiTurnRollout
from twinkle_client.sampler.types import (
    SampledSequence,
    SampleResult,
    SamplingParams,
    use_logprob_pairs,
)

PARAMS = SamplingParams(max_tokens=64, logprobs=1)
SYSTEM = {"role": "system", "content": "Reach 3 with the add tool."}


@pytest.fixture(scope="module")
def template():
    return Qwen3_5Template(model_id="tiny://qwen3.5", enable_thinking=False)


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedSampler:
    """Answers the k-th sample call of trajectory i with ``script[i][k]``: the completion's text
    is tokenised and closed with ``<|im_end|>`` (unless ``end=False``); log-probs count down
    from -0.01 so every token's value is known."""

    def __init__(self, template, script, end=True, logprobs=True, stop_reason="stop"):
        self.template = template
        self.script = [list(s) for s in script]
        self.end, self.logprobs, self.stop_reason = end, logprobs, stop_reason
        self.calls: list[list[list[int]]] = []
        self.completions: list[list[int]] = []
        self.adapters: list[dict] = []

    def sample(self, inputs, sampling_params=None, **adapter):
        params = SamplingParams.coerce(sampling_params)
        self.adapters.append(adapter)
        self.calls.append([list(x["input_ids"]) for x in inputs])
        turn = len(self.calls) - 1
        running = [i for i, s in enumerate(self.script) if len(s) > 0]
        results = []
        for i, item in zip(running, inputs):
            text = self.script[i].pop(0)
            tokens = self.template.tokenizer.encode(text, add_special_tokens=False)
            if self.end:
                tokens.append(self.template.eos_token_id)
            self.completions.append(tokens)
            lps = [-0.01 * (k + 1) - turn for k in range(len(tokens))] if self.logprobs else []
            seq = SampledSequence(tokens=tokens, logprobs=lps, stop_reason=self.stop_reason)
            seq.text = self.template.decode(tokens, skip_special_tokens=True)
            results.append(SampleResult(prompt_tokens=list(item["input_ids"]), sequences=[seq]))
        use_logprob_pairs(results, params)
        return results


class CounterEnv(Env):
    """Adds to a counter; the episode ends at ``goal`` with reward 1 (0 before)."""

    def __init__(self, goal=3):
        self.goal, self.value, self.closed = goal, 0, False
        self.actions: list[tuple[str, dict]] = []

    def reset(self):
        self.value = 0
        return StepResult(observation="counter=0")

    def step(self, tool_name, arguments):
        self.actions.append((tool_name, dict(arguments)))
        self.value += int(arguments["n"])
        done = self.value >= self.goal
        return StepResult(
            observation=f"counter={self.value}", reward=1.0 if done else 0.0, done=done
        )


def counter_trajectory(env):
    tool = EnvTool(env, tool_name="add", description="Add n.", parameters={"type": "object"})
    manager = ToolManager([tool])
    first = env.reset().observation
    trajectory = {
        "messages": [SYSTEM, {"role": "user", "content": first}],
        "tools": manager.tool_infos(),
    }
    return trajectory, manager, tool


def trained(labels):
    return [i for i, label in enumerate(labels) if label != IGNORE_INDEX]


def test_a_tool_turn_then_an_answer(template):
    env = CounterEnv(goal=10)
    trajectory, manager, tool = counter_trajectory(env)
    sampler = ScriptedSampler(template, [[call("add", n=2), "The counter is 2."]])
    rollout = ClientMultiTurnRollout(sampler=sampler, template=template, sampling_params=PARAMS)

    (out,) = rollout([trajectory], tool_manager=[manager])

    assert out["turns"] == 2 and len(sampler.calls) == 2
    assert out["stop_reason"] == "stop" and out["truncated"] is False
    assert env.actions == [("add", {"n": 2})]
    assert [m["role"] for m in out["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert out["messages"][3] == {"role": "tool", "name": "add", "content": "counter=2"}
    assert out["messages"][2]["tool_calls"] == [
        {"type": "function", "function": {"name": "add", "arguments": {"n": 2}}}
    ]
    assert out["tools"] == manager.tool_infos()
    # Turn 2's prompt is turn 1's prompt, the completion, then the tool turn and the next
    # generation prompt, none of them trained.
    prompt = template.encode(trajectory, add_generation_prompt=True)["input_ids"].tolist()
    first, second = sampler.completions
    bridge = sampler.calls[1][0][len(prompt) + len(first) :]
    assert sampler.calls[1][0][: len(prompt) + len(first)] == prompt + first
    assert template.decode(bridge) == (
        "\n<|im_start|>tool\ncounter=2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert out["input_ids"] == prompt + first + bridge + second
    # Only the model's own tokens carry labels, and one log-prob each.
    positions = trained(out["labels"])
    start2 = len(prompt) + len(first) + len(bridge)
    assert positions == list(range(len(prompt), len(prompt) + len(first))) + list(
        range(start2, start2 + len(second))
    )
    assert [out["labels"][i] for i in positions] == first + second
    expected = [-0.01 * (k + 1) for k in range(len(first))]
    expected += [-0.01 * (k + 1) - 1 for k in range(len(second))]
    assert [lp[0][1] for lp in out["logprobs"]] == pytest.approx(expected)
    assert [lp[0][0] for lp in out["logprobs"]] == first + second
    old = out["old_logprobs"]
    assert len(old) == len(out["input_ids"])
    assert [old[i] for i in positions] == pytest.approx(expected)
    assert all(old[i] == 0.0 for i in range(len(old)) if i not in set(positions))
    assert tool.episode_reward == 0.0 and not tool.done
    # What a training call sends is the training fields only; the record reads by key.
    assert set(dict(out)) == {"input_ids", "labels", "old_logprobs"}
    assert training_inputs([out]) == [
        {"input_ids": out["input_ids"], "labels": out["labels"], "old_logprobs": old}
    ]
    assert out.get("turns") == 2 and "messages" in out and out.get("nothing", 5) == 5
    with pytest.raises(KeyError):
        out["nothing"]


def test_the_episode_ending_stops_the_trajectory_and_the_reward_is_the_envs(template):
    env = CounterEnv(goal=3)
    trajectory, manager, tool = counter_trajectory(env)
    sampler = ScriptedSampler(template, [[call("add", n=1), call("add", n=2), "never sampled"]])
    rollout = ClientMultiTurnRollout(sampler=sampler, template=template, sampling_params=PARAMS)

    (out,) = rollout([trajectory], tool_manager=manager)

    assert out["turns"] == 2 and len(sampler.calls) == 2
    assert out["stop_reason"] == "env_done" and out["truncated"] is False
    assert out["messages"][-1] == {"role": "tool", "name": "add", "content": "counter=3"}
    assert tool.done and tool.episode_reward == 1.0 and manager.done
    # The trajectory's tokens end with the model's last action: the final observation is kept
    # in messages only.
    assert out["input_ids"][-len(sampler.completions[-1]) :] == sampler.completions[-1]
    assert len(trained(out["labels"])) == len(out["logprobs"]) == sum(map(len, sampler.completions))


def test_max_turns_truncates_a_trajectory_that_still_calls_tools(template):
    env = CounterEnv(goal=100)
    trajectory, manager, _ = counter_trajectory(env)
    sampler = ScriptedSampler(template, [[call("add", n=1)] * 5])
    rollout = ClientMultiTurnRollout(
        sampler=sampler, template=template, sampling_params=PARAMS, max_turns=2
    )

    (out,) = rollout([trajectory], tool_manager=[manager])

    assert out["turns"] == 2 and len(sampler.calls) == 2
    assert out["stop_reason"] == "max_turns" and out["truncated"] is True
    assert len(env.actions) == 1  # the second call is cut off, not run


def test_a_completion_cut_at_max_tokens_runs_no_tool(template):
    env = CounterEnv()
    trajectory, manager, _ = counter_trajectory(env)
    sampler = ScriptedSampler(template, [[call("add", n=1)]], end=False, stop_reason="length")
    rollout = ClientMultiTurnRollout(sampler=sampler, template=template, sampling_params=PARAMS)

    (out,) = rollout([trajectory], tool_manager=[manager])

    assert out["turns"] == 1 and out["truncated"] is True and out["stop_reason"] == "length"
    assert env.actions == []


def test_trajectories_finish_independently_in_one_batched_call_per_round(template):
    envs = [CounterEnv(goal=100) for _ in range(3)]
    setups = [counter_trajectory(env) for env in envs]
    script = [["done"], [call("add", n=1), "done"], [call("add", n=2), call("add", n=3), "done"]]
    sampler = ScriptedSampler(template, script)
    rollout = ClientMultiTurnRollout(sampler=sampler, template=template, sampling_params=PARAMS)

    outs = rollout([s[0] for s in setups], tool_manager=[s[1] for s in setups])

    assert [len(c) for c in sampler.calls] == [3, 2, 1]
    assert sampler.adapters == [{}, {}, {}]
    assert [o["turns"] for o in outs] == [1, 2, 3]
    assert [env.value for env in envs] == [0, 1, 5]
    assert [len([m for m in o["messages"] if m["role"] == "tool"]) for o in outs] == [0, 1, 2]


def test_a_stop_string_ending_gets_an_untrained_end_of_turn_token(template):
    env = CounterEnv(goal=10)
    trajectory, manager, _ = counter_trajectory(env)
    sampler = ScriptedSampler(template, [[call("add", n=1), "ok"]], end=False)
    rollout = ClientMultiTurnRollout(sampler=sampler, template=template, sampling_params=PARAMS)

    (out,) = rollout([trajectory], tool_manager=[manager])

    prompt = template.encode(trajectory, add_generation_prompt=True)["input_ids"].tolist()
    first = sampler.completions[0]
    bridge_start = len(prompt) + len(first)
    assert out["input_ids"][bridge_start] == template.eos_token_id
    assert out["labels"][bridge_start] == IGNORE_INDEX


def test_without_logprobs_there_are_no_old_logprobs(template):
    env = CounterEnv()
    trajectory, manager, _ = counter_trajectory(env)
    sampler = ScriptedSampler(template, [["no tools"]], logprobs=False)
    out = ClientMultiTurnRollout(sampler=sampler, template=template)([trajectory], manager)[0]

    assert out["logprobs"] is None and "old_logprobs" not in out
    assert out["turns"] == 1 and len(trained(out["labels"])) == len(sampler.completions[0])


def test_a_malformed_or_unknown_tool_call_is_answered_with_an_error(template):
    env = CounterEnv(goal=10)
    trajectory, manager, _ = counter_trajectory(env)
    script = [["<tool_call>\n{not json}\n</tool_call>", call("jump"), "ok"]]
    sampler = ScriptedSampler(template, script)
    rollout = ClientMultiTurnRollout(sampler=sampler, template=template, sampling_params=PARAMS)

    (out,) = rollout([trajectory], tool_manager=[manager])

    tool_answers = [m["content"] for m in out["messages"] if m["role"] == "tool"]
    assert tool_answers[0].startswith("Error: the tool call is not valid JSON")
    assert tool_answers[1] == "Error: unknown tool 'jump'; available tools: add"
    assert env.actions == [] and out["turns"] == 3


def test_invalid_arguments_are_refused(template):
    sampler = ScriptedSampler(template, [[call("add", n=1)]])
    with pytest.raises(ValueError, match="num_samples=1"):
        ClientMultiTurnRollout(sampler, template, sampling_params={"num_samples": 2})
    with pytest.raises(ValueError, match="max_turns"):
        ClientMultiTurnRollout(sampler, template, max_turns=0)
    with pytest.raises(ValueError, match="template is required"):
        ClientMultiTurnRollout(sampler, None)
    rollout = ClientMultiTurnRollout(sampler, template, sampling_params=PARAMS)
    trajectory = {"messages": [{"role": "user", "content": "go"}]}
    with pytest.raises(TypeError, match="must be a list"):
        rollout(trajectory)
    with pytest.raises(ValueError, match="2 tool managers for 1 trajectories"):
        rollout([trajectory], tool_manager=[None, None])
    with pytest.raises(
        ValueError, match=r"trajectories\[0\] made a tool call but has no tool_manager"
    ):
        rollout([trajectory])


def test_a_prompt_over_max_length_is_refused():
    short = Qwen3_5Template(model_id="tiny://qwen3.5", max_length=4, truncation_strategy="delete")
    rollout = ClientMultiTurnRollout(ScriptedSampler(short, [[]]), short)
    with pytest.raises(ValueError, match=r"trajectories\[0\].*max_length \(4\)"):
        rollout([{"messages": [{"role": "user", "content": "a long enough prompt"}]}])


def test_rolled_out_trajectories_train_with_upstreams_old_logps(template):
    from peft import LoraConfig

    from twinkle.model import MultiLoraTransformersModel
    from twinkle.sampler import TorchSampler

    model_id = "tiny://qwen3.5"
    model = MultiLoraTransformersModel(model_id)
    model.add_adapter_to_model("default", LoraConfig(r=4, lora_alpha=8))
    model.set_loss("GRPOLoss", epsilon=0.2)
    model.set_optimizer("Adam", lr=1e-3)
    model.set_template("Qwen3_5Template", enable_thinking=False)
    sampler = TorchSampler(model_id)
    sampler.set_template("Qwen3_5Template", model_id=model_id, enable_thinking=False)
    params = SamplingParams(max_tokens=6, logprobs=1, seed=0)
    rollout = ClientMultiTurnRollout(sampler=sampler, template=template, sampling_params=params)
    trajectories = [{"messages": [SYSTEM, {"role": "user", "content": f"n={i}"}]} for i in range(2)]

    rolled = rollout(trajectories, tool_manager=[None, None])

    old_logps = [[lp[0][1] for lp in t["logprobs"]] for t in rolled]
    assert [len(lps) for lps in old_logps] == [len(trained(t["labels"])) for t in rolled]
    out = model.forward_backward(inputs=rolled, advantages=[1.0, -1.0], old_logps=old_logps)
    assert out["num_tokens"] == sum(len(lps) for lps in old_logps)


def test_the_adapter_to_sample_with_is_passed_to_every_sample_call(template):
    env = CounterEnv(goal=10)
    trajectory, manager, _ = counter_trajectory(env)
    sampler = ScriptedSampler(template, [[call("add", n=1), "ok"]])
    rollout = ClientMultiTurnRollout(sampler, template, adapter_uri="inflight://default")
    rollout([trajectory], tool_manager=[manager])
    rollout.adapter_uri, rollout.adapter_name = None, "policy"
    sampler.script = [["ok"]]
    rollout([trajectory], tool_manager=[manager])
    assert sampler.adapters == [{"adapter_uri": "inflight://default"}] * 2 + [
        {"adapter_name": "policy"}
    ]
