"""twinkle.reward with upstream's trajectories and with our sample results."""

import numpy as np
import pytest

import twinkle.rl
from twinkle.data_format import Message, Trajectory
from twinkle.errors import ArgumentTypeError, InvalidArgumentError
from twinkle.reward import (
    Completion,
    CountDownAccuracy,
    FormatReward,
    GSM8KAccuracyReward,
    GSM8KFormatReward,
    MathReward,
    Reward,
    completions,
)
from twinkle.reward.base import Reward as BaseReward
from twinkle.reward.countdown import evaluate_arithmetic
from twinkle.sampler import SampledSequence, SampleResult


def traj(reply, user_data=None, **kwargs):
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": reply}]
    return {"messages": messages, "user_data": user_data or [], **kwargs}


def result(texts, **extra):
    seqs = [SampledSequence(tokens=[2], logprobs=[-1.0], stop_reason="stop", text=t) for t in texts]
    return SampleResult(prompt_tokens=[1], sequences=seqs, extra=extra)


def test_format_reward_upstream_default_is_think_and_answer_tags():
    trajectories = [
        traj("<think>a</think>\n<answer>1+2</answer>"),
        traj("<answer>3</answer> after <think>x</think>"),
        traj("<answer>3</answer>"),
        traj("no tags"),
    ]
    rewards = FormatReward()(trajectories, [])
    assert rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    # the seed's namespace keeps its default, and both accept both input styles
    assert twinkle.rl.FormatReward()(["Answer: 3", "3"]).tolist() == [1.0, 0.0]
    assert twinkle.rl.FormatReward()([traj("Answer: 12")]).tolist() == [1.0]
    assert FormatReward(r"\d+")([result(["12", "1 2"])]).tolist() == [1.0, 0.0]


def test_countdown_accuracy():
    data = [{"target": 7, "nums": [3, 4]}]
    replies = [
        "<answer>3 + 4</answer>",
        "<think>..</think><answer>4+3 = 7</answer>",
        "<answer>3*4</answer>",
        "<answer>3+3</answer>",
        "<answer>__import__('os')</answer>",
        "no answer",
    ]
    rewards = CountDownAccuracy()([traj(r, data) for r in replies], [])
    assert rewards.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # our Trajectory with extra, and a division by zero
    ours = Trajectory(
        messages=[Message(role="assistant", content="<answer>3/(4-4)</answer>")],
        extra={"target": 1, "nums": [3, 4, 4]},
    )
    assert CountDownAccuracy()([ours]).tolist() == [0.0]
    assert evaluate_arithmetic("(1 + 2) / 3 * 4") == 4.0
    with pytest.raises(ValueError):
        evaluate_arithmetic("2 ** 10")


def test_gsm8k_accuracy_and_format():
    gt = [("ground_truth", "1000")]
    replies = ["so #### 1000", "\\boxed{1,000.0}", "#### 999", "no answer", "\\boxed{}"]
    trajectories = [traj(r, gt) for r in replies]
    assert GSM8KAccuracyReward()(trajectories).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert GSM8KFormatReward()(trajectories, []).tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    # no ground truth -> 0; raw GSM8K answers as ground truths; our sample results
    assert GSM8KAccuracyReward()([traj("#### 5")]).tolist() == [0.0]
    raw = ["Natalia sold 48/2 = 24 clips.\n#### 72"]
    assert GSM8KAccuracyReward()([traj("#### 72")], raw).tolist() == [1.0]
    assert GSM8KAccuracyReward()([result(["#### 7", "#### 8"], ground_truth="7")]).tolist() == [
        1.0,
        0.0,
    ]


def test_math_reward_upstream_ground_truth_trajectories():
    preds = [traj("\\boxed{\\frac{1}{2}}"), traj("\\boxed{\\frac{1}{3}}"), traj("\\boxed{4.0}")]
    truths = [traj("so \\boxed{\\frac{1}{2}}"), traj("\\boxed{\\frac12}"), traj("# Answer\n4")]
    assert MathReward()(preds, truths).tolist() == [1.0, 0.0, 1.0]
    # a solution in upstream user_data, and a pydantic Trajectory with extra
    solution = [("solution", "Adding gives \\boxed{5}.")]
    assert MathReward()([traj("\\boxed{5}", solution), traj("5.5", solution)]).tolist() == [
        1.0,
        0.0,
    ]
    ours = Trajectory(messages=[Message(role="assistant", content="= 12")], extra={"answer": 12})
    assert MathReward()([ours]).tolist() == [1.0]
    with pytest.raises(InvalidArgumentError, match="reference"):
        MathReward()([traj("1")])


def test_subclass_and_completions():
    class Brevity(Reward):
        def score(self, completion: Completion) -> float:
            return 1.0 / len(completion.text)

    assert BaseReward is Reward
    np.testing.assert_allclose(Brevity()([traj("ab"), "abcd"]), [0.5, 0.25])
    items = completions([result(["a", "b"], answer=1), "c"], ground_truths=[10, 20])
    assert [(c.text, c.reference, dict(c.data)) for c in items] == [
        ("a", 10, {"answer": 1}),
        ("b", 10, {"answer": 1}),
        ("c", 20, {}),
    ]
    with pytest.raises(InvalidArgumentError, match="2 references for 1 inputs"):
        completions(["a"], ["x", "y"])
    with pytest.raises(ArgumentTypeError, match="int"):
        completions([3])
    with pytest.raises(NotImplementedError):
        Reward()(["x"])
