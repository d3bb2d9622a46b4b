"""Advantages and rewards against hand-computed values."""

import numpy as np
import pytest

from twinkle.rl import FormatReward, GRPOAdvantage, MathReward, RLOOAdvantage, final_number
from twinkle.sampler import SampledSequence, SampleResult


def test_grpo_advantage_hand_computed():
    # group [1, 0, 0, 1]: mean 0.5, population std 0.5 -> +-1; group [2, 2, 2, 2]: all 0.
    adv = GRPOAdvantage(group_size=4, eps=0.0)([1, 0, 0, 1, 2, 2, 2, 2])
    np.testing.assert_allclose(adv, [1, -1, -1, 1, 0, 0, 0, 0])
    # [0, 3]: mean 1.5, std 1.5 -> -1, 1 (with eps 1e-6 nearly)
    np.testing.assert_allclose(GRPOAdvantage(2)([0, 3]), [-1, 1], atol=1e-5)
    np.testing.assert_allclose(GRPOAdvantage(2, scale_by_std=False)([0, 3]), [-1.5, 1.5])


def test_rloo_advantage_hand_computed():
    # r=[1, 2, 6]: baselines (2+6)/2=4, (1+6)/2=3.5, (1+2)/2=1.5
    np.testing.assert_allclose(RLOOAdvantage(3)([1, 2, 6]), [-3, -1.5, 4.5])


def test_group_size_errors():
    with pytest.raises(ValueError, match="groups of 3"):
        GRPOAdvantage(3)([1, 2, 3, 4])
    with pytest.raises(ValueError):
        RLOOAdvantage(1)


def _result(texts, answer):
    return SampleResult(
        prompt_tokens=[1],
        sequences=[
            SampledSequence(tokens=[2], logprobs=[-1.0], stop_reason="stop", text=t) for t in texts
        ],
        extra={"answer": answer},
    )


def test_math_reward_uses_final_number_and_extra_answer():
    results = [_result(["3 + 4 = 7", "7.0", "it is 8"], 7), _result(["-2", "none"], -2)]
    np.testing.assert_array_equal(MathReward()(results), [1, 1, 0, 1, 0])
    np.testing.assert_array_equal(MathReward()(["12", "x 5"], references=[12, 6]), [1, 0])
    assert final_number("a 1 b -2.5") == "-2.5" and final_number("none") is None
    with pytest.raises(ValueError, match="reference"):
        MathReward()(["1"])


def test_format_reward():
    np.testing.assert_array_equal(
        FormatReward()(["Answer: 12", " Answer: -3 ", "Answer 3", "12"]), [1, 1, 0, 0]
    )
    np.testing.assert_array_equal(FormatReward(r"\d+")([_result(["12", "1 2"], 0)]), [1, 0])
