"""OpenSpiel's blackjack as an OpenEnv environment embedded in-process, alone and in a
``ClientMultiTurnRollout`` (needs ``twinkle[agentic]``: openenv-core and open-spiel)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from twinkle_agentic.envs import EnvTool, OpenEnv
from twinkle_agentic.tools.tool_manager import ToolManager

HAVE_AGENTIC = all(importlib.util.find_spec(m) for m in ("openenv", "pyspiel"))
needs_agentic = pytest.mark.skipif(
    not HAVE_AGENTIC,
    reason="openenv-core / open-spiel not installed (pip install 'twinkle[agentic]')",
)
ACTIONS = {"hit": 0, "stand": 1}


def mapper(tool_name, arguments):
    return {"action_id": ACTIONS[arguments["action"]], "game_name": "blackjack"}


def blackjack(seed):
    env_kwargs = {"game_name": "blackjack", "seed": seed}
    return OpenEnv(env_name="openspiel_env", env_kwargs=env_kwargs, action_mapper=mapper)


@pytest.mark.skipif(HAVE_AGENTIC, reason="checks the message shown without the agentic extra")
def test_without_the_extra_the_error_names_it():
    with pytest.raises(ModuleNotFoundError, match=r"twinkle\[agentic\]"):
        blackjack(0)


@needs_agentic
def test_blackjack_hides_the_dealer_card_and_pays_the_game_result():
    import pyspiel

    env = blackjack(seed=0)
    first = env.reset()
    assert "Dealer: Cards: ??" in first.observation
    assert first.observation.endswith("Legal actions: 0 = Hit, 1 = Stand.")
    assert (first.reward, first.done) == (0.0, False)
    result = env.step("play", {"action": "stand"})
    assert result.done and "The game is over" in result.observation
    # Replaying the dealt cards in pyspiel gives the same result.
    raw = env.env._game_state
    replay = pyspiel.load_game("blackjack").new_initial_state()
    for action in raw.history():
        replay.apply_action(action)
    assert replay.is_terminal() and result.reward == replay.returns()[0]
    assert result.reward in (-1.0, 0.0, 1.0)
    with pytest.raises(RuntimeError, match="the game is over"):
        env.step("play", {"action": "hit"})
    env.close()


@needs_agentic
def test_same_seed_same_cards_and_an_illegal_action_is_refused():
    a, b = blackjack(seed=7), blackjack(seed=7)
    assert a.reset().observation == b.reset().observation
    with pytest.raises(ValueError, match="action_id 5 is not legal now"):
        a.env.step(a.action_cls(action_id=5, game_name="blackjack"))


@needs_agentic
def test_a_rollout_plays_blackjack_until_the_game_ends():
    from twinkle.template import Qwen3_5Template
    from twinkle_client.rollout import ClientMultiTurnRollout
    from twinkle_client.sampler.types import (
        SampledSequence,
        SampleResult,
        SamplingParams,
        use_logprob_pairs,
    )

    template = Qwen3_5Template(model_id="tiny://qwen3.5", enable_thinking=False)
    stand = f"<tool_call>\n{json.dumps({'name': 'play', 'arguments': {'action': 'stand'}})}\n</tool_call>"

    class AlwaysStand:
        calls = 0

        def sample(self, inputs, sampling_params=None):
            AlwaysStand.calls += 1
            out = []
            for item in inputs:
                tokens = template.tokenizer.encode(stand, add_special_tokens=False)
                tokens.append(template.eos_token_id)
                seq = SampledSequence(tokens, [-0.5] * len(tokens), "stop")
                seq.text = template.decode(tokens, skip_special_tokens=True)
                out.append(SampleResult(list(item["input_ids"]), [seq]))
            use_logprob_pairs(out, SamplingParams.coerce(sampling_params))
            return out

    envs = [blackjack(seed) for seed in (1, 2)]
    tools, trajectories = [], []
    for env in envs:
        tool = EnvTool(env=env, tool_name="play", description="Hit or stand.")
        manager = ToolManager([tool])
        tools.append((tool, manager))
        observation = env.reset().observation
        trajectories.append(
            {"messages": [{"role": "user", "content": observation}], "tools": manager.tool_infos()}
        )
    rollout = ClientMultiTurnRollout(
        sampler=AlwaysStand(),
        template=template,
        sampling_params=SamplingParams(max_tokens=64, logprobs=1),
        max_turns=4,
    )

    outs = rollout(trajectories, tool_manager=[m for _, m in tools])

    assert AlwaysStand.calls == 1
    for out, (tool, _), env in zip(outs, tools, envs):
        assert out["turns"] == 1 and out["stop_reason"] == "env_done"
        assert out["messages"][0]["content"].startswith("Current Phase: Player Turn")
        assert out["messages"][-1]["role"] == "tool"
        assert "The game is over" in out["messages"][-1]["content"]
        assert tool.done and tool.episode_reward == env.env._game_state.returns()[0]
        assert [lp[0][1] for lp in out["logprobs"]] == [-0.5] * len(out["logprobs"])
        env.close()
