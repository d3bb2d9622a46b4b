"""The seed's RL loop on the real model: save -> sample -> reward -> advantages -> train."""

import numpy as np
import torch
from peft import LoraConfig

from twinkle.model import MultiLoraTransformersModel
from twinkle.rl import GRPOAdvantage
from twinkle.sampler import TorchSampler


def test_grpo_step_updates_only_that_tenants_adapter(tmp_path):
    model_id = "tiny://qwen3.5"
    model = MultiLoraTransformersModel(model_id)
    model.add_adapter_to_model(
        "tenant_b", LoraConfig(r=4, lora_alpha=8, init_lora_weights=False), seed=1
    )
    model.add_adapter_to_model(
        "tenant_c", LoraConfig(r=4, lora_alpha=8, init_lora_weights=False), seed=2
    )
    model.set_loss("GRPOLoss", epsilon=0.2, adapter_name="tenant_b")
    model.set_optimizer("Adam", lr=1e-2, adapter_name="tenant_b")
    model.set_template("Qwen3_5Template", adapter_name="tenant_b")
    sampler = TorchSampler(model_id, allowed_adapter_dirs=[tmp_path])
    sampler.set_template("Qwen3_5Template", model_id=model_id)

    before_b = {k: v.clone() for k, v in model.adapter_state_dict("tenant_b").items()}
    before_c = {k: v.clone() for k, v in model.adapter_state_dict("tenant_c").items()}
    adapter_path = model.save("step-0", output_dir=tmp_path, adapter_name="tenant_b")
    batch = [
        {"messages": [{"role": "user", "content": f"{i}+1="}]} for i in range(2) for _ in range(4)
    ]
    responses = sampler.sample(
        inputs=batch, sampling_params={"max_tokens": 4, "seed": 0}, adapter_uri=adapter_path
    )
    rewards = (
        np.array([len(r.sequences[0].tokens) % 2 for r in responses], dtype=np.float32)
        + np.arange(8) * 0.1
    )
    advantages = GRPOAdvantage(group_size=4)(rewards)

    out = model.forward_backward(inputs=responses, advantages=advantages, adapter_name="tenant_b")
    # On-policy: the trainer's log-probs are the sampler's, so the ratio is 1.
    assert abs(out["metrics"]["ratio_mean"] - 1.0) < 1e-4
    for row_lp, result in zip(out["logprobs"], responses):
        np.testing.assert_allclose(row_lp, result.sequences[0].logprobs, atol=1e-4)
    model.clip_grad_and_step(adapter_name="tenant_b")

    after_b, after_c = model.adapter_state_dict("tenant_b"), model.adapter_state_dict("tenant_c")
    assert any(not torch.equal(before_b[k], after_b[k]) for k in before_b)
    assert all(torch.equal(before_c[k], after_c[k]) for k in before_c)
