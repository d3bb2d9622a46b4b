"""``optim_step(AdamParams)`` honours every AdamParams field exactly as torch.optim.AdamW (with
torch's gradient clipping) does on the same gradients."""

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import AdamParams, MultiLoraTransformersModel

PARAMS = AdamParams(
    learning_rate=3e-3, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.05
)


@pytest.mark.parametrize("clip", [PARAMS.grad_clip_norm, 0.0], ids=["clipped", "unclipped"])
def test_two_optim_steps_equal_torch_adamw(clip):
    params = AdamParams(**{**PARAMS.__dict__, "grad_clip_norm": clip})
    model = MultiLoraTransformersModel("tiny://qwen3", seed=0)
    model.add_adapter_to_model("a", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    tenant = model.tenants["a"]
    reference = [p.detach().clone().requires_grad_(True) for p in tenant.params]
    adamw = torch.optim.AdamW(
        reference,
        lr=params.learning_rate,
        betas=(params.beta1, params.beta2),
        eps=params.eps,
        weight_decay=params.weight_decay,
    )
    for step in range(2):
        model.forward_backward(make_batch(seed=step), adapter_name="a")
        for ref, p in zip(reference, tenant.params):
            ref.grad = p.grad.detach().clone()
        norm = torch.nn.utils.clip_grad_norm_(reference, clip if clip > 0 else float("inf"))
        adamw.step()
        result = model.optim_step(params, adapter_name="a")
        assert result["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
        if clip:
            assert result["grad_norm"] > clip  # clipping was in effect
        for ref, p in zip(reference, tenant.params):
            torch.testing.assert_close(p.detach(), ref.detach(), rtol=0, atol=1e-6)
