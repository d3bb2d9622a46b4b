"""twinkle.advantage: upstream's call style and ours, against numpy and hand computations."""

import numpy as np
import pytest
import torch

from twinkle.advantage import Advantage, GAEAdvantage, GRPOAdvantage, RLOOAdvantage
from twinkle.errors import InvalidArgumentError

REWARDS = [1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0]


def _numpy_grpo(rewards, g, scale):
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, g)
    centred = r - r.mean(axis=1, keepdims=True)
    if scale == "group":
        return (centred / (r.std(axis=1, keepdims=True) + 1e-6)).reshape(-1)
    if scale == "batch":
        return (centred / (r.std() + 1e-6)).reshape(-1)
    return centred.reshape(-1)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_upstream_call_style_matches_numpy(scale):
    advantages = GRPOAdvantage()(REWARDS, num_generations=4, scale=scale)
    assert isinstance(advantages.tolist(), list) and advantages.dtype == np.float32
    np.testing.assert_allclose(advantages, _numpy_grpo(REWARDS, 4, scale), rtol=1e-6)


def test_grpo_hand_values_and_defaults():
    # group [3, 1, 2, 2]: mean 2, population std sqrt(0.5) -> +-sqrt(2), 0, 0
    expected = [1, -1, -1, 1, 2**0.5, -(2**0.5), 0, 0]
    np.testing.assert_allclose(GRPOAdvantage()(REWARDS, num_generations=4), expected, atol=1e-5)
    # the constructor's group size is the default; a call's num_generations overrides it
    np.testing.assert_allclose(GRPOAdvantage(group_size=4)(REWARDS), expected, atol=1e-5)
    np.testing.assert_allclose(
        GRPOAdvantage(group_size=8)(REWARDS, num_generations=4), expected, atol=1e-5
    )
    # scale_by_std=False: Dr. GRPO, centred only
    np.testing.assert_allclose(GRPOAdvantage(2, scale_by_std=False)([0, 3]), [-1.5, 1.5])
    assert isinstance(GRPOAdvantage(), Advantage)


def test_grpo_tensor_in_tensor_out():
    out = GRPOAdvantage()(torch.tensor([0.0, 1.0]), num_generations=2)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, torch.tensor([-1.0, 1.0]), atol=1e-5, rtol=0)


def test_grpo_errors():
    with pytest.raises(InvalidArgumentError, match="num_generations"):
        GRPOAdvantage()([1.0, 2.0])
    with pytest.raises(InvalidArgumentError, match="groups of 3"):
        GRPOAdvantage()([1, 2, 3, 4], num_generations=3)
    with pytest.raises(InvalidArgumentError, match="scale"):
        GRPOAdvantage()([1, 2], num_generations=2, scale="gdpo")
    with pytest.raises(InvalidArgumentError, match="flat"):
        GRPOAdvantage()([[1, 2], [3, 4]], num_generations=2)


def test_rloo_both_styles_and_scale():
    # r = [1, 2, 6]: baselines (2+6)/2=4, (1+6)/2=3.5, (1+2)/2=1.5
    np.testing.assert_allclose(RLOOAdvantage()([1, 2, 6], num_generations=3), [-3, -1.5, 4.5])
    np.testing.assert_allclose(RLOOAdvantage(3)([1, 2, 6]), [-3, -1.5, 4.5])
    std = np.std([1, 2, 6])
    np.testing.assert_allclose(
        RLOOAdvantage()([1, 2, 6], num_generations=3, scale="group"),
        np.array([-3, -1.5, 4.5]) / (std + 1e-6),
        rtol=1e-6,
    )
    with pytest.raises(InvalidArgumentError, match=">= 2"):
        RLOOAdvantage()([1, 2], num_generations=1)


def test_gae_hand_computed():
    gae = GAEAdvantage(gamma=1.0, gae_lambda=1.0, normalize=False)
    adv, ret = gae([[0.0, 0.0, 1.0]], [[0.5, 0.5, 0.5]])
    np.testing.assert_allclose(adv, [[0.5, 0.5, 0.5]])
    np.testing.assert_allclose(ret, [[1.0, 1.0, 1.0]])
    # gamma 0.9, lambda 0.5: deltas -0.05, -0.05, 0.5; A2=0.5, A1=-0.05+0.45*0.5, A0=-0.05+0.45*A1
    adv, _ = GAEAdvantage(gamma=0.9, gae_lambda=0.5, normalize=False)(
        [0.0, 0.0, 1.0], [0.5, 0.5, 0.5]
    )
    np.testing.assert_allclose(adv, [[0.02875, 0.175, 0.5]], rtol=1e-5)


def test_gae_mask_normalize_and_token_rewards():
    gae = GAEAdvantage(gamma=1.0, gae_lambda=1.0, normalize=False)
    adv, ret = gae([[0.0, 1.0, 5.0]], [[0.0, 0.0, 9.0]], masks=[[1, 1, 0]])
    np.testing.assert_allclose(adv, [[1.0, 1.0, 0.0]])
    np.testing.assert_allclose(ret, [[1.0, 1.0, 0.0]])
    adv, _ = GAEAdvantage(gamma=1.0, gae_lambda=1.0)([[0.0, 0.0, 1.0]], [[0.0, 0.5, 0.5]])
    raw = np.array([1.0, 0.5, 0.5])
    np.testing.assert_allclose(adv[0], (raw - raw.mean()) / raw.std(), rtol=1e-5)
    assert GAEAdvantage.build_token_rewards([1.0, 2.0], [2, 3]) == [[0, 1], [0, 0, 2]]
    kl = GAEAdvantage.build_token_rewards(
        [1.0], [2], old_logps=[[-1.0, -1.0]], ref_logps=[[-2.0, -1.0]], kl_coef=0.1
    )
    np.testing.assert_allclose(kl, [[-0.1, 1.0]])
    with pytest.raises(InvalidArgumentError, match="gamma"):
        GAEAdvantage(gamma=1.5)
    with pytest.raises(InvalidArgumentError, match="shape"):
        gae([[0.0, 1.0]], [[0.0]])
