"""Tinker token losses: summed, unnormalised, exactly the protocol's formulas."""

import math

import pytest
import torch

from twinkle.loss import LossInputs, get_loss

pytestmark = pytest.mark.unit

LP = [[-1.0, -2.0, -0.5], [-0.2, -1.0, 0.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
RATIOS = [[1.0, 1.5, 0.5], [1.25, 0.9, 1.0]]
ADV = [[1.0, 2.0, -1.0], [-1.0, 0.5, 0.0]]


def _inputs(with_adv=True, with_q=True, weights=None):
    lp = torch.tensor(LP, dtype=torch.float64, requires_grad=True)
    q = torch.tensor(LP, dtype=torch.float64) - torch.log(torch.tensor(RATIOS, dtype=torch.float64))
    mask = torch.tensor(MASK, dtype=torch.float64)
    return lp, LossInputs(
        logprobs=lp,
        mask=mask,
        target_tokens=torch.zeros_like(mask, dtype=torch.int64),
        advantages=torch.tensor(ADV, dtype=torch.float64) if with_adv else None,
        old_logprobs=q if with_q else None,
        weights=None if weights is None else torch.tensor(weights, dtype=torch.float64),
    )


def test_cross_entropy_sums_with_weights_or_mask():
    _, plain = _inputs()
    out = get_loss("cross_entropy")(plain)
    assert out.loss.item() == pytest.approx(1 + 2 + 0.5 + 0.2 + 1)
    assert out.metrics == {"loss": pytest.approx(4.7)}
    _, weighted = _inputs(weights=[[1.0, 0.5, 0.0], [2.0, 1.0, 3.0]])
    # -( -1*1 - 2*0.5 - 0.2*2 - 1*1 )
    assert get_loss("cross_entropy")(weighted).loss.item() == pytest.approx(3.4)


def test_importance_sampling():
    lp, inputs = _inputs()
    out = get_loss("importance_sampling")(inputs)
    # -(1*1 + 1.5*2 + 0.5*-1 + 1.25*-1 + 0.9*0.5)
    assert out.loss.item() == pytest.approx(-2.7)
    out.loss.backward()
    expected = -torch.tensor(RATIOS, dtype=torch.float64) * torch.tensor(ADV) * torch.tensor(MASK)
    assert torch.allclose(lp.grad, expected)


def test_ppo_values_and_clipped_gradients():
    lp, inputs = _inputs()
    out = get_loss("ppo")(inputs)
    # min(rA, clip(r)A): 1, min(3, 2.4), min(-0.5, -0.8), min(-1.25, -1.2), 0.45
    assert out.loss.item() == pytest.approx(-(1 + 2.4 - 0.8 - 1.25 + 0.45))
    out.loss.backward()
    expected = torch.tensor([[-1.0, 0.0, 0.0], [1.25, -0.45, 0.0]], dtype=torch.float64)
    assert torch.allclose(lp.grad, expected)


def test_ppo_custom_thresholds():
    _, inputs = _inputs()
    # lo=0.5, hi=2.0 clips nothing here, so ppo equals importance sampling.
    loss = get_loss("ppo", clip_low_threshold=0.5, clip_high_threshold=2.0)
    assert loss(inputs).loss.item() == pytest.approx(-2.7)


def test_cispo_value_and_stop_gradient():
    lp, inputs = _inputs()
    out = get_loss("cispo")(inputs)
    # clip(r) = 1.0, 1.2, 0.8, 1.2, 0.9 -> -sum clip(r) * lp * A
    assert out.loss.item() == pytest.approx(-(-1.0 - 4.8 + 0.4 + 0.24 - 0.45))
    out.loss.backward()
    # The ratio is stop-gradient: d/dlp = -clip(r) * A exactly, no r' term.
    expected = torch.tensor([[-1.0, -2.4, 0.8], [1.2, -0.45, 0.0]], dtype=torch.float64)
    assert torch.allclose(lp.grad, expected)


def test_dro_value_and_gradient():
    lp, inputs = _inputs()
    out = get_loss("dro", beta=0.5)(inputs)
    log_r = [math.log(r) for r in (1.0, 1.5, 0.5, 1.25, 0.9)]
    lps, advs = (-1.0, -2.0, -0.5, -0.2, -1.0), (1.0, 2.0, -1.0, -1.0, 0.5)
    expected = sum(-(x * a - 0.25 * d * d) for x, a, d in zip(lps, advs, log_r))
    assert expected == pytest.approx(4.9764372126)
    assert out.loss.item() == pytest.approx(expected)
    out.loss.backward()
    # d/dlp = -A + beta * (lp - q)
    grads = [-a + 0.5 * d for a, d in zip(advs, log_r)]
    assert lp.grad[0].tolist() == pytest.approx(grads[:3])
    assert lp.grad[1].tolist() == pytest.approx(grads[3:] + [0.0])


def test_per_row_advantages_broadcast():
    _, inputs = _inputs()
    inputs.advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    # -(1 + 1.5 + 0.5) + (1.25 + 0.9)
    assert get_loss("importance_sampling")(inputs).loss.item() == pytest.approx(-0.85)


@pytest.mark.parametrize(
    ("name", "kwargs", "missing", "with_adv", "with_q"),
    [
        ("importance_sampling", {}, "old_logprobs", True, False),
        ("ppo", {}, "advantages", False, True),
        ("cispo", {}, "advantages", False, True),
        ("dro", {"beta": 0.1}, "old_logprobs", True, False),
    ],
)
def test_missing_inputs_name_loss_and_input(name, kwargs, missing, with_adv, with_q):
    _, inputs = _inputs(with_adv=with_adv, with_q=with_q)
    with pytest.raises(ValueError, match=f"{name}.*{missing}"):
        get_loss(name, **kwargs)(inputs)


def test_dro_requires_beta():
    with pytest.raises(ValueError, match="dro.*beta"):
        get_loss("dro")
