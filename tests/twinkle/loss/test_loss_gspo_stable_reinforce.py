"""GSPO and StableReinforce, pinned by numbers worked out by hand (summed, Tinker's convention)."""

import math

import pytest
import torch

from twinkle.loss import LossInputs, get_loss, known_losses

pytestmark = pytest.mark.unit


def _inputs(lp, log_ratio, mask, adv, weights=None):
    lp_B_T = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    q_B_T = lp_B_T.detach() - torch.tensor(log_ratio, dtype=torch.float64)
    mask_B_T = torch.tensor(mask, dtype=torch.float64)
    return lp_B_T, LossInputs(
        logprobs=lp_B_T,
        mask=mask_B_T,
        target_tokens=torch.zeros_like(mask_B_T, dtype=torch.int64),
        advantages=torch.tensor(adv, dtype=torch.float64),
        old_logprobs=q_B_T,
        weights=None if weights is None else torch.tensor(weights, dtype=torch.float64),
    )


def test_both_are_registered_next_to_the_five():
    names = set(known_losses())
    assert {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"} <= names
    assert {"gspo", "stable_reinforce"} <= names


def test_gspo_clips_the_sequence_ratio_not_the_tokens():
    # Row 0: ratio mask [1, 1, 0]: s = exp((0.2 - 0.1) / 2) = exp(0.05) = 1.0512711 in [0.9, 1.1],
    #   A = 1: each masked token adds -s * A; the third (0.5, outside the mask) adds nothing.
    # Row 1: s = exp((0.4 + 0.6) / 2) = exp(0.5) = 1.6487213, A = 2: min(3.297, 1.1 * 2) = 2.2
    #   per token, clipped (no gradient): -4.4.
    # Row 2: s = exp(-0.5) = 0.6065307, A = -1: min(-0.6065, -0.9) = -0.9 per token: +1.8.
    lp, inputs = _inputs(
        lp=[[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.0], [-1.5, -0.2, -1.0]],
        log_ratio=[[0.2, -0.1, 0.5], [0.4, 0.6, 0.0], [-0.5, -0.5, 0.0]],
        mask=[[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]],
        adv=[1.0, 2.0, -1.0],
        weights=[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
    )
    loss = get_loss("gspo", clip_low_threshold=0.9, clip_high_threshold=1.1)
    out = loss(inputs)
    s0 = math.exp(0.05)
    assert out.loss.item() == pytest.approx(-2 * s0 - 4.4 + 1.8, abs=1e-9)
    assert out.num_tokens == 6
    assert out.metrics["clip_frac"] == pytest.approx(2 / 3)
    out.loss.backward()
    # d/dlp_t of -s * A * (its token) is -s * A: the gradient of GSPO-token.
    expected = [[-s0, -s0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    torch.testing.assert_close(lp.grad, torch.tensor(expected, dtype=torch.float64))


def test_gspo_without_a_ratio_mask_averages_over_the_targets_and_has_the_paper_defaults():
    # One row, log ratios 0.0001 and 0.0003 -> s = exp(0.0002) inside [1 - 3e-4, 1 + 4e-4].
    lp, inputs = _inputs(lp=[[-1.0, -1.0]], log_ratio=[[1e-4, 3e-4]], mask=[[1.0, 1.0]], adv=[0.5])
    out = get_loss("gspo")(inputs)
    assert out.loss.item() == pytest.approx(-2 * 0.5 * math.exp(2e-4), abs=1e-12)
    # A token ratio of exp(0.0003) is inside; the sequence ratio, not the token's, decides.
    _, far = _inputs(lp=[[-1.0, -1.0]], log_ratio=[[0.0, 0.001]], mask=[[1.0, 1.0]], adv=[1.0])
    # s = exp(0.0005) > 1.0004: clipped at 1.0004 per token.
    assert get_loss("gspo")(far).loss.item() == pytest.approx(-2 * 1.0004, abs=1e-12)


def test_stable_reinforce_truncates_the_weight_and_adds_the_kl_penalty():
    # C = 2, kl_coeff = 0.5; k3 = exp(d) - d - 1 with d = q - lp.
    # Row 0, t0: r = 1 -> w = 1: -1 * 1 * (-1.0) = 1.0; d = 0 -> k3 = 0.
    # Row 0, t1: r = 3 -> w = 2: -2 * 1 * (-0.5) = 1.0; d = -ln 3 -> k3 = 1/3 + ln 3 - 1.
    # Row 0, t2: weight 0 (not a sampled token): ignored, whatever its ratio.
    # Row 1, t0: r = 0.5 -> w = 0.5, A = -1: -0.5 * -1 * (-2.0) = -1.0; d = ln 2 -> k3 = 1 - ln 2.
    lp, inputs = _inputs(
        lp=[[-1.0, -0.5, -0.1], [-2.0, 0.0, 0.0]],
        log_ratio=[[0.0, math.log(3.0), 5.0], [math.log(0.5), 0.0, 0.0]],
        mask=[[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]],
        adv=[[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]],
        weights=[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]],
    )
    out = get_loss("stable_reinforce", clip_high_threshold=2.0, kl_coeff=0.5)(inputs)
    k3_t1 = 1 / 3 + math.log(3.0) - 1  # 0.4319456
    k3_r1 = 1 - math.log(2.0)  # 0.3068528
    assert out.loss.item() == pytest.approx(1.0 + 1.0 - 1.0 + 0.5 * (k3_t1 + k3_r1), abs=1e-9)
    assert out.num_tokens == 3
    assert out.metrics["truncated_frac"] == pytest.approx(1 / 3)
    out.loss.backward()
    # -w * A + kl_coeff * (1 - exp(d)): t0 -1 + 0; t1 -2 + 0.5 * (1 - 1/3); row 1: 0.5 + 0.5 * (1 - 2).
    expected = [[-1.0, -2.0 + 1 / 3, 0.0], [0.0, 0.0, 0.0]]
    torch.testing.assert_close(lp.grad, torch.tensor(expected, dtype=torch.float64))


def test_stable_reinforce_defaults_are_a_cap_of_two_and_no_kl():
    _, inputs = _inputs(lp=[[-1.0]], log_ratio=[[math.log(4.0)]], mask=[[1.0]], adv=[1.0])
    # w = min(4, 2) = 2: -2 * 1 * (-1.0) = 2.0, no KL term.
    assert get_loss("stable_reinforce")(inputs).loss.item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="clip_high_threshold"):
        get_loss("stable_reinforce", clip_high_threshold=0.0)
