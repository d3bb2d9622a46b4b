"""DPOLoss against hand-computed pair logits: sigmoid, IPO, hinge, smoothing and SFT term."""

import math

import pytest
import torch

from twinkle.loss import DPOLoss, LossInputs

pytestmark = pytest.mark.unit

# Rows: chosen0, rejected0, chosen1, rejected1. Row 2's second token is masked.
LP = [[-1.0, -1.0], [-2.0, -1.0], [-3.0, 0.0], [-1.0, -1.0]]
REF = [[-1.5, -1.0], [-1.5, -1.5], [-2.0, 0.0], [-1.0, -1.5]]
MASK = [[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
# Sequence sums: policy (-2, -3, -3, -2), reference (-2.5, -3, -2, -2.5).
# Pair 0: beta * ((-2 + 2.5) - (-3 + 3)) = 0.1 * 0.5 = 0.05
# Pair 1: beta * ((-3 + 2) - (-2 + 2.5)) = 0.1 * -1.5 = -0.15
LOGITS = (0.05, -0.15)


def _neg_logsigmoid(x):
    return math.log1p(math.exp(-x))


def _inputs(rows=(0, 1, 2, 3)):
    rows = list(rows)
    lp = torch.tensor(LP, dtype=torch.float64)[rows].requires_grad_(True)
    mask = torch.tensor(MASK, dtype=torch.float64)[rows]
    return lp, LossInputs(
        logprobs=lp,
        mask=mask,
        target_tokens=torch.zeros_like(mask, dtype=torch.int64),
        ref_logprobs=torch.tensor(REF, dtype=torch.float64)[rows],
    )


def test_dpo_sigmoid_value_and_metrics():
    _, inputs = _inputs()
    loss = DPOLoss(beta=0.1)
    assert loss.needs_reference is True
    out = loss(inputs)
    expected = (_neg_logsigmoid(0.05) + _neg_logsigmoid(-0.15)) / 2
    assert expected == pytest.approx(0.7197083479)
    assert out.loss.item() == pytest.approx(expected)
    assert out.metrics["reward_accuracy"] == pytest.approx(0.5)
    assert out.metrics["reward_margin"] == pytest.approx(-0.05)
    assert out.metrics["chosen_reward"] == pytest.approx((0.05 - 0.1) / 2)
    assert out.num_tokens == 7


def test_dpo_label_smoothing():
    _, inputs = _inputs()
    out = DPOLoss(beta=0.1, label_smoothing=0.1)(inputs)
    expected = sum(0.9 * _neg_logsigmoid(x) + 0.1 * _neg_logsigmoid(-x) for x in LOGITS) / 2
    assert out.loss.item() == pytest.approx(expected)


def test_dpo_ipo_and_hinge():
    _, inputs = _inputs()
    # IPO: (logits/beta - 1/(2 beta))^2 = (0.5 - 5)^2, (-1.5 - 5)^2
    assert DPOLoss(beta=0.1, loss_type="ipo")(inputs).loss.item() == pytest.approx(
        (20.25 + 42.25) / 2
    )
    # Hinge: relu(1 - logits) = 0.95, 1.15
    assert DPOLoss(beta=0.1, loss_type="hinge")(inputs).loss.item() == pytest.approx(1.05)


def test_dpo_sft_term_uses_chosen_rows_only():
    _, inputs = _inputs()
    base = (_neg_logsigmoid(0.05) + _neg_logsigmoid(-0.15)) / 2
    # Chosen tokens: -1, -1 (row 0) and -3 (row 2, second masked): CE = 5 / 3
    out = DPOLoss(beta=0.1, sft_weight=0.5)(inputs)
    assert out.loss.item() == pytest.approx(base + 0.5 * 5 / 3)


def test_dpo_gradient_sign_pushes_chosen_up():
    lp, inputs = _inputs()
    DPOLoss(beta=0.1)(inputs).loss.backward()
    # d loss / d lp_chosen = -beta * sigmoid(-logit) / num_pairs on every masked chosen token.
    g0 = -0.1 * (1 / (1 + math.exp(0.05))) / 2
    assert lp.grad[0, 0].item() == pytest.approx(g0)
    assert lp.grad[1, 0].item() == pytest.approx(-g0)
    assert lp.grad[2, 1].item() == 0.0


def test_dpo_pair_layout_swapping_rows_flips_margin():
    _, swapped = _inputs(rows=(1, 0, 3, 2))
    out = DPOLoss(beta=0.1)(swapped)
    assert out.metrics["reward_margin"] == pytest.approx(0.05)
    expected = (_neg_logsigmoid(-0.05) + _neg_logsigmoid(0.15)) / 2
    assert out.loss.item() == pytest.approx(expected)


def test_dpo_errors():
    _, odd = _inputs(rows=(0, 1, 2))
    with pytest.raises(ValueError, match="odd"):
        DPOLoss()(odd)
    _, inputs = _inputs()
    inputs.ref_logprobs = None
    with pytest.raises(ValueError, match="ref_logprobs"):
        DPOLoss()(inputs)
    with pytest.raises(ValueError, match="loss_type"):
        DPOLoss(loss_type="kto")
