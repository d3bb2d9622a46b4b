"""CrossEntropyLoss values against hand-computed sums, and the loss registry's rules."""

import pytest
import torch

from twinkle import loss as loss_pkg
from twinkle.loss import (
    CrossEntropyLoss,
    GRPOLoss,
    Loss,
    LossInputs,
    LossOutput,
    PPOLoss,
    get_loss,
    register_loss,
    registry,
)

pytestmark = pytest.mark.unit

# Row 0 has a padded last position (mask 0, logprob 0 by contract).
LP = [[-1.0, -2.0, 0.0], [-0.5, -1.5, -3.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]


def _inputs(weights=None):
    lp = torch.tensor(LP, requires_grad=True)
    mask = torch.tensor(MASK)
    targets = torch.where(mask > 0, torch.tensor(7), torch.tensor(-100))
    w = None if weights is None else torch.tensor(weights)
    return lp, LossInputs(logprobs=lp, mask=mask, target_tokens=targets, weights=w)


def test_cross_entropy_mean_is_average_over_masked_tokens():
    lp, inputs = _inputs()
    out = CrossEntropyLoss()(inputs)
    # (1 + 2 + 0.5 + 1.5 + 3) / 5
    assert out.loss.item() == pytest.approx(1.6)
    assert out.num_tokens == 5
    assert out.metrics == {"loss": pytest.approx(1.6)}
    out.loss.backward()
    assert torch.allclose(lp.grad, -torch.tensor(MASK) / 5)


def test_cross_entropy_sum():
    _, inputs = _inputs()
    assert CrossEntropyLoss(reduction="sum")(inputs).loss.item() == pytest.approx(8.0)


def test_cross_entropy_weighted_mean_ignores_masked_weights():
    # The weight 5 sits on a masked position and must not count.
    _, inputs = _inputs(weights=[[2.0, 1.0, 5.0], [0.0, 1.0, 1.0]])
    # (2*1 + 1*2 + 0*0.5 + 1*1.5 + 1*3) / (2 + 1 + 0 + 1 + 1) = 8.5 / 5
    assert CrossEntropyLoss()(inputs).loss.item() == pytest.approx(1.7)


def test_cross_entropy_empty_mask_is_zero_not_nan():
    lp = torch.zeros(1, 2, requires_grad=True)
    inputs = LossInputs(logprobs=lp, mask=torch.zeros(1, 2), target_tokens=torch.full((1, 2), -100))
    out = CrossEntropyLoss()(inputs)
    assert out.loss.item() == 0.0 and out.num_tokens == 0


def test_cross_entropy_rejects_unknown_reduction():
    with pytest.raises(ValueError, match="reduction"):
        CrossEntropyLoss(reduction="max")


def test_get_loss_by_name_class_and_instance():
    ppo = get_loss("ppo", clip_low_threshold=0.7)
    assert isinstance(ppo, PPOLoss) and ppo.clip_low_threshold == 0.7
    grpo = get_loss(GRPOLoss, epsilon=0.3)
    assert isinstance(grpo, GRPOLoss) and grpo.epsilon == 0.3
    assert get_loss(grpo) is grpo
    assert get_loss("CrossEntropyLoss").name == "CrossEntropyLoss"


def test_get_loss_errors():
    with pytest.raises(TypeError):
        get_loss(GRPOLoss(), epsilon=0.1)
    with pytest.raises(ValueError, match="GRPOLoss") as err:
        get_loss("grpo_typo")
    for name in ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "DPOLoss"):
        assert name in str(err.value)
    with pytest.raises(TypeError):
        get_loss("CrossEntropyLoss", not_an_arg=1)
    with pytest.raises(TypeError):
        get_loss(42)


def test_register_user_loss(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @register_loss("my_l2")
    class L2(Loss):
        def __init__(self, scale: float = 1.0):
            self.scale = scale

        def __call__(self, inputs):
            value = self.scale * (inputs.logprobs**2 * inputs.mask).sum()
            return LossOutput(loss=value, num_tokens=1, metrics={"loss": float(value.detach())})

    built = get_loss("my_l2", scale=2.0)
    assert built.name == "my_l2"
    _, inputs = _inputs()
    # 2 * (1 + 4 + 0.25 + 2.25 + 9)
    assert built(inputs).loss.item() == pytest.approx(33.0)
    with pytest.raises(ValueError, match="already registered"):
        register_loss("ppo")(L2)
    with pytest.raises(TypeError):
        register_loss("not_a_loss")(object)


def test_public_surface():
    assert set(loss_pkg.__all__) == {
        "BNPOLoss",
        "CISPOLoss",
        "CPOLoss",
        "CrossEntropyLoss",
        "CustomGraphLoss",
        "DPOLoss",
        "DROLoss",
        "DRGRPOLoss",
        "GKDLoss",
        "GRPOLoss",
        "GSPOLoss",
        "ImportanceSamplingLoss",
        "InfonceLoss",
        "Loss",
        "LossInputs",
        "LossOutput",
        "MSELoss",
        "ORPOLoss",
        "PPOLoss",
        "SAPOLoss",
        "SimPOLoss",
        "StableReinforceLoss",
        "TinkerCrossEntropyLoss",
        "loss_from_spec",
        "get_loss",
        "known_losses",
        "register_alias",
        "register_loss",
    }
    assert Loss.needs_reference is False
