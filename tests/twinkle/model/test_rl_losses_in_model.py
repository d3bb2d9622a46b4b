"""DPO and GRPO through the model: reference log-probs come from the base with the adapter disabled."""

import math

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel


@pytest.fixture
def model():
    m = MultiLoraTransformersModel("tiny://qwen3")
    m.add_adapter_to_model("pref", LoraConfig(r=8, lora_alpha=16))
    m.set_optimizer("Adam", lr=1e-2)
    return m


def test_dpo_starts_at_log2_and_learns_the_preference(model):
    model.set_loss("DPOLoss", beta=0.1)
    pairs = make_batch(rows=4, seq=20, seed=3)  # rows (0, 1) and (2, 3) are (chosen, rejected)
    first = model.forward_backward(pairs)
    # A fresh adapter is a no-op, so policy == reference and the DPO logit is exactly 0.
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)
    model.clip_grad_and_step()
    for _ in range(10):
        out = model.forward_backward(pairs)
        model.clip_grad_and_step()
    assert out["loss"] < math.log(2) - 0.05
    assert out["metrics"]["reward_accuracy"] == 1.0


def test_grpo_with_kl_starts_at_minus_mean_advantage(model):
    model.set_loss("GRPOLoss", epsilon=0.2, beta=0.1)
    advantages = torch.tensor([1.0, -1.0, 0.5, 0.5])
    out = model.forward_backward(make_batch(rows=4, seq=16), advantages=advantages)
    assert out["loss"] == pytest.approx(-0.25, abs=1e-6)
    assert out["metrics"]["kl"] == pytest.approx(0.0, abs=1e-7)
    model.clip_grad_and_step()
    out = model.forward_backward(make_batch(rows=4, seq=16), advantages=advantages)
    assert out["metrics"]["kl"] > 0  # the adapter moved away from the reference


def test_dpo_rejects_odd_batches_without_touching_gradients(model):
    model.set_loss("DPOLoss", beta=0.1)
    with pytest.raises(ValueError):
        model.forward_backward(make_batch(rows=3))
    assert all(p.grad is None for p in model.tenants["pref"].params)
