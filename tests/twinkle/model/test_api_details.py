"""Smaller API promises: processor instances, scheduler typos, forward/calculate_loss/backward."""

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel
from twinkle.processor import InputProcessor


@pytest.fixture
def model():
    m = MultiLoraTransformersModel("tiny://qwen3")
    m.add_adapter_to_model("t", LoraConfig(r=4, lora_alpha=8))
    return m


def test_a_processor_instance_is_used_as_given(model):
    processor = InputProcessor(padding_side="left", pad_token_id=0)
    model.set_processor(processor)
    assert model.tenants["t"].processor is processor


def test_scheduler_typos_are_errors_and_change_nothing(model):
    with pytest.raises(ValueError, match="warmup_steps"):
        model.set_lr_scheduler("cosine", warmup_steps=3)
    with pytest.raises(ValueError, match="unknown lr scheduler"):
        model.set_lr_scheduler("Wiggly")
    assert model.tenants["t"].scheduler is None


def test_forward_calculate_loss_backward_equals_forward_backward(model):
    batch = make_batch()
    model.set_loss("GRPOLoss", epsilon=0.2)
    advantages = torch.tensor([1.0, -1.0, 0.5, 0.0])
    model.forward(batch)
    loss = model.calculate_loss(advantages=advantages)
    model.backward()
    split = [p.grad.clone() for p in model.tenants["t"].params]
    model.zero_grad()
    out = model.forward_backward(batch, advantages=advantages)
    assert out["loss"] == pytest.approx(loss)
    for a, p in zip(split, model.tenants["t"].params):
        torch.testing.assert_close(a, p.grad)


def test_resume_refuses_a_checkpoint_of_another_base_model(model, tmp_path):
    model.set_optimizer("Adam", lr=1e-3)
    model.forward_backward(make_batch())
    model.clip_grad_and_step()
    path = model.save("ck", output_dir=tmp_path, save_optimizer=True)
    other = MultiLoraTransformersModel("tiny://qwen3.5")
    other.add_adapter_to_model("t", LoraConfig(r=4, lora_alpha=8))
    with pytest.raises(ValueError, match="trained on tiny://qwen3"):
        other.resume_from_checkpoint(path)


def test_resume_restores_a_scheduler_that_was_not_set_yet(model, tmp_path):
    model.set_optimizer("AdamW", lr=1.0)
    model.set_lr_scheduler("cosine", num_warmup_steps=0, num_training_steps=4)
    for _ in range(2):
        model.forward_backward(make_batch())
        model.clip_grad_and_step()
    path = model.save("ck", output_dir=tmp_path, save_optimizer=True)
    fresh = MultiLoraTransformersModel("tiny://qwen3")
    fresh.add_adapter_to_model("t", LoraConfig(r=4, lora_alpha=8))
    fresh.resume_from_checkpoint(path)
    assert fresh.calculate_metric().result["lr"] == pytest.approx(
        model.calculate_metric().result["lr"]
    )
