"""GRPOLoss against hand-computed surrogate values, reductions, clipping and KL."""

import math

import pytest
import torch

from twinkle.loss import GRPOLoss, LossInputs

pytestmark = pytest.mark.unit

LP = [[-1.0, -2.0, 0.0], [-0.5, -1.0, -1.5]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
# Chosen ratios r = exp(lp - old); row 0 has A = +1, row 1 has A = -2.
RATIOS = [[1.5, 0.5, 1.0], [1.1, 0.7, 1.3]]
ADV = [1.0, -2.0]


def _inputs(ratios=RATIOS, adv=ADV, lp=LP, mask=MASK, ref=None):
    lp_t = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    old = torch.tensor(lp, dtype=torch.float64) - torch.log(
        torch.tensor(ratios, dtype=torch.float64)
    )
    mask_t = torch.tensor(mask, dtype=torch.float64)
    return lp_t, LossInputs(
        logprobs=lp_t,
        mask=mask_t,
        target_tokens=torch.zeros_like(mask_t, dtype=torch.int64),
        advantages=torch.tensor(adv, dtype=torch.float64),
        old_logprobs=old,
        ref_logprobs=None if ref is None else torch.tensor(ref, dtype=torch.float64),
    )


# Per-token -min(r*A, clip(r, 0.8, 1.2)*A):
#   row 0 (A=1):  r=1.5 -> -1.2 (clipped), r=0.5 -> -0.5
#   row 1 (A=-2): r=1.1 -> 2.2, r=0.7 -> 1.6 (clipped), r=1.3 -> 2.6
@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [
        ("grpo", ((-1.2 - 0.5) / 2 + (2.2 + 1.6 + 2.6) / 3) / 2),
        ("bnpo", (-1.7 + 6.4) / 5),
        ("dr_grpo", (-1.7 + 6.4) / 6),
    ],
)
def test_grpo_reductions(loss_type, expected):
    _, inputs = _inputs()
    out = GRPOLoss(epsilon=0.2, loss_type=loss_type)(inputs)
    assert out.loss.item() == pytest.approx(expected)
    assert out.num_tokens == 5


def test_grpo_metrics():
    _, inputs = _inputs()
    out = GRPOLoss()(inputs)
    # Clipped tokens: row 0 r=1.5 (A>0) and row 1 r=0.7 (A<0).
    assert out.metrics["clip_frac"] == pytest.approx(2 / 5)
    assert out.metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.7 + 1.3) / 5)
    assert "kl" not in out.metrics


def test_grpo_gradient_zero_where_clipped():
    lp, inputs = _inputs()
    GRPOLoss(loss_type="bnpo")(inputs).loss.backward()
    # d/dlp of -r*A is -r*A where unclipped, 0 where the clipped branch wins; /5 tokens.
    expected = torch.tensor([[0.0, -0.5, 0.0], [2.2, 0.0, 2.6]], dtype=torch.float64) / 5
    assert torch.allclose(lp.grad, expected)


@pytest.mark.parametrize(
    ("ratio", "adv", "grad_flows"),
    [
        (1.2 - 1e-4, 1.0, True),
        (1.2 + 1e-4, 1.0, False),
        (0.8 + 1e-4, -1.0, True),
        (0.8 - 1e-4, -1.0, False),
        # Pessimistic min: a large ratio with a negative advantage is never clipped.
        (1.5, -1.0, True),
    ],
)
def test_grpo_clip_boundaries(ratio, adv, grad_flows):
    lp, inputs = _inputs(ratios=[[ratio]], adv=[adv], lp=[[-1.0]], mask=[[1.0]])
    out = GRPOLoss(epsilon=0.2)(inputs)
    expected_value = -min(ratio * adv, min(max(ratio, 0.8), 1.2) * adv)
    assert out.loss.item() == pytest.approx(expected_value)
    out.loss.backward()
    assert lp.grad.item() == pytest.approx(-ratio * adv if grad_flows else 0.0)


def test_grpo_epsilon_high():
    _, inputs = _inputs(ratios=[[1.25]], adv=[1.0], lp=[[-1.0]], mask=[[1.0]])
    assert GRPOLoss(epsilon=0.2)(inputs).loss.item() == pytest.approx(-1.2)
    assert GRPOLoss(epsilon=0.2, epsilon_high=0.28)(inputs).loss.item() == pytest.approx(-1.25)


def test_grpo_on_policy_without_old_logprobs():
    lp, inputs = _inputs()
    inputs.old_logprobs = None
    out = GRPOLoss(loss_type="bnpo")(inputs)
    # r = 1 everywhere: loss = -mean(A) over tokens = -(2*1 + 3*(-2)) / 5
    assert out.loss.item() == pytest.approx(0.8)
    out.loss.backward()
    expected = -torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0]], dtype=torch.float64) / 5
    assert torch.allclose(lp.grad, expected)


def test_grpo_per_token_advantages():
    _, inputs = _inputs(ratios=[[1.0, 1.0]], adv=[[1.0, 3.0]], lp=[[-1.0, -1.0]], mask=[[1.0, 1.0]])
    assert GRPOLoss()(inputs).loss.item() == pytest.approx(-2.0)


def test_grpo_kl_term():
    # ref - lp = -0.5; k3 = e^-0.5 + 0.5 - 1
    kl = math.exp(-0.5) - 0.5
    _, inputs = _inputs(ratios=[[1.0]], adv=[0.0], lp=[[-1.0]], mask=[[1.0]], ref=[[-1.5]])
    loss = GRPOLoss(beta=0.1)
    assert loss.needs_reference is True and GRPOLoss().needs_reference is False
    out = loss(inputs)
    assert out.loss.item() == pytest.approx(0.1 * kl)
    assert out.metrics["kl"] == pytest.approx(kl)


def test_grpo_errors():
    _, inputs = _inputs()
    with pytest.raises(ValueError, match="ref_logprobs"):
        GRPOLoss(beta=0.1)(inputs)
    inputs.advantages = None
    with pytest.raises(ValueError, match="GRPOLoss.*advantages"):
        GRPOLoss()(inputs)
    with pytest.raises(ValueError, match="loss_type"):
        GRPOLoss(loss_type="ppo")
