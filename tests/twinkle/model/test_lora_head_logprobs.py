"""Logits-free log-probs through an LM head that carries adapters (a Tinker model's default
``train_unembed``): the same losses and gradients as the materialised logits, for tenants with
different ranks fused in one pass, a DPO tenant with its bare reference pass, and rows of a
tenant whose adapter leaves the head alone; the head's ``[tokens, vocab]`` logits never computed."""

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.step.passes import linear_head, lora_head

WITH_HEAD = ["q_proj", "v_proj", "down_proj", "lm_head"]
TENANTS = {
    "sft": (4, WITH_HEAD, None),
    "dpo": (8, WITH_HEAD, ("DPOLoss", {"beta": 0.1})),
    "body_only": (4, ["q_proj", "v_proj"], None),
}


def _model(linear_logprobs):
    torch.manual_seed(0)
    m = MultiLoraTransformersModel("tiny://qwen3", options={"linear_logprobs": linear_logprobs})
    for name, (rank, targets, loss) in TENANTS.items():
        config = LoraConfig(r=rank, lora_alpha=16, target_modules=targets, init_lora_weights=False)
        m.add_adapter_to_model(name, config)
        m.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
        if loss is not None:
            m.set_loss(loss[0], adapter_name=name, **loss[1])
    return m


def _requests():
    return {
        "sft": {"inputs": make_batch(rows=2, seq=20, seed=1)},
        "dpo": {"inputs": make_batch(rows=4, seq=16, seed=2)},
        "body_only": {"inputs": make_batch(rows=3, seq=12, seed=3)},
    }


def test_the_head_with_adapters_is_taken_logits_free():
    m = _model(True)
    assert lora_head(m.model) is not None
    assert linear_head(m.model) is m.model.lm_head.base_layer.weight
    calls = []
    m.model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    m.forward_backward_many(_requests())
    assert calls == []  # no [tokens, vocab] logits through the head module


def test_losses_and_gradients_equal_the_materialised_logits():
    free, full = _model(True), _model(False)
    got, want = free.forward_backward_many(_requests()), full.forward_backward_many(_requests())
    for name in TENANTS:
        assert got[name]["loss"] == pytest.approx(want[name]["loss"], rel=1e-5, abs=1e-6)
        params = dict(free.model.named_parameters())
        for key, ref in full.model.named_parameters():
            if f".{name}." not in key or ref.grad is None:
                continue
            torch.testing.assert_close(params[key].grad, ref.grad, rtol=1e-4, atol=1e-6)
    head_keys = [k for k, p in free.model.named_parameters() if "lm_head.lora_B.sft" in k]
    assert head_keys and dict(free.model.named_parameters())[head_keys[0]].grad.abs().sum() > 0


def test_forward_only_and_a_step_agree_too():
    free, full = _model(True), _model(False)
    for m in (free, full):
        m.forward_backward_many(_requests())
        m.clip_grad_and_step_many(list(TENANTS))
    a = free.forward_only(inputs=make_batch(rows=2, seq=10, seed=9), adapter_name="sft")
    b = full.forward_only(inputs=make_batch(rows=2, seq=10, seed=9), adapter_name="sft")
    torch.testing.assert_close(
        torch.as_tensor(a["logprobs"]), torch.as_tensor(b["logprobs"]), rtol=1e-4, atol=1e-5
    )
