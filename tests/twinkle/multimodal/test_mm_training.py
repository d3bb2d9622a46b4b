"""Training on the multimodal base: text-only and image tenants in one fused pass, LoRA on the
language model and (per tenant) on the vision tower, standard PEFT checkpoints."""

import json

import pytest
import torch
from peft import LoraConfig
from safetensors.torch import load_file

from tests.twinkle.multimodal.conftest import VL_MODEL, image_trajectories, text_trajectories
from twinkle.errors import InvalidArgumentError
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.step.vision import vision_inputs

VISION_TARGETS = ["q_proj", "v_proj", "qkv", "attn.proj", "linear_fc1", "linear_fc2"]
CONFIGS = {
    "text": LoraConfig(r=4, lora_alpha=8, init_lora_weights=False),
    "image": LoraConfig(r=8, lora_alpha=16, init_lora_weights=False),
    "vision": LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=VISION_TARGETS),
}


def _requests():
    return {
        "text": {"inputs": text_trajectories(3)},
        "image": {"inputs": image_trajectories(3)},
        "vision": {"inputs": image_trajectories(2, start=5)},
    }


@pytest.fixture(scope="module")
def model():
    m = MultiLoraTransformersModel(VL_MODEL)
    for name, config in CONFIGS.items():
        m.add_adapter_to_model(name, config)
        m.set_template("Qwen3_5Template", adapter_name=name)
        m.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    return m


def _grads(m, name):
    return [p.grad.clone() for p in m.tenants[name].params]


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def test_the_base_keeps_its_vision_tower(model):
    assert type(model.model).__name__ == "Qwen3_5ForConditionalGeneration"
    names = {n for n, _ in model.model.named_modules()}
    assert any(n.startswith("model.visual.blocks.") for n in names)


def test_all_linear_adapts_the_language_model_only_and_targets_add_the_tower(model):
    from twinkle.model.lora.inject import lora_layers

    layers = lora_layers(model.model)
    image = {n for n, layer in layers.items() if "image" in layer.lora_A}
    vision = {n for n, layer in layers.items() if "vision" in layer.lora_A}
    assert image and not any(n.startswith("model.visual.") for n in image)
    assert any(n.startswith("model.visual.blocks.") for n in vision)
    assert "model.visual.merger.linear_fc1" in vision
    assert all(layers[n].scope == "vision" for n in vision if n.startswith("model.visual."))


def test_fused_text_and_image_step_equals_separate_steps(model):
    visual_calls = []
    hook = model.model.model.visual.register_forward_hook(
        lambda mod, args, out: visual_calls.append(args[0].shape[0])
    )
    try:
        separate, losses = {}, {}
        for name, request in _requests().items():
            model.zero_grad(adapter_name=name)
            losses[name] = model.forward_backward(request["inputs"], adapter_name=name)["loss"]
            separate[name] = _grads(model, name)
            model.zero_grad(adapter_name=name)
        # The text tenant's own pass never ran the vision tower.
        assert visual_calls == [3 * 16, 2 * 16]
        visual_calls.clear()
        fused = model.forward_backward_many(_requests())
        # One vision pass over exactly the image rows' patches (3 + 2 images of 16 patches).
        assert visual_calls == [5 * 16]
    finally:
        hook.remove()
    for name in CONFIGS:
        assert fused[name]["loss"] == pytest.approx(losses[name], rel=1e-5)
        grads = _grads(model, name)
        assert len(grads) == len(separate[name])
        for g_fused, g_sep in zip(grads, separate[name]):
            assert _rel(g_fused, g_sep) <= 1e-5
    # The vision tower's adapters learn from the images: non-zero gradients there.
    tenant = model.tenants["vision"]
    vision_grads = [
        p.grad for n, p in model.model.named_parameters() if "visual" in n and ".vision." in n
    ]
    assert vision_grads and all(g.abs().sum() > 0 for g in vision_grads)
    assert len(tenant.params) == 24  # 2 LM + 10 vision-tower / merger modules, A and B each
    for name in CONFIGS:
        model.zero_grad(adapter_name=name)


def test_a_step_changes_only_its_own_tenant(model):
    before = {name: model.adapter_state_dict(name) for name in CONFIGS}
    model.forward_backward(image_trajectories(2), adapter_name="vision")
    model.clip_grad_and_step(adapter_name="vision")
    after = {name: model.adapter_state_dict(name) for name in CONFIGS}
    for name in ("text", "image"):
        assert all(torch.equal(before[name][k], after[name][k]) for k in before[name])
    changed = [
        k for k in before["vision"] if not torch.equal(before["vision"][k], after["vision"][k])
    ]
    assert any(".visual." in k for k in changed) and any("language_model" in k for k in changed)


def test_image_tenant_loss_falls(model):
    data = image_trajectories(4, start=8)
    first = model.forward_backward(data, adapter_name="image")["loss"]
    model.clip_grad_and_step(adapter_name="image")
    for _ in range(5):
        model.forward_backward(data, adapter_name="image")
        model.clip_grad_and_step(adapter_name="image")
    last = model.forward_only(data, adapter_name="image")["loss"]
    assert last < first * 0.8, (first, last)


def test_checkpoint_is_standard_peft_and_loads_in_peft(model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    path = model.save("mm", output_dir=tmp_path, adapter_name="vision")
    config = json.loads((tmp_path / "mm" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == sorted(VISION_TARGETS)
    weights = load_file(str(tmp_path / "mm" / "adapter_model.safetensors"))
    assert set(weights) == set(model.adapter_state_dict("vision"))
    assert any(k.startswith("base_model.model.model.visual.blocks.0.attn.qkv") for k in weights)

    base = AutoModelForImageTextToText.from_pretrained(model.model_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, path).eval()
    samples = image_trajectories(2)
    batch = model._collate(model.tenants["vision"], samples, {})
    inputs = batch.tensors
    # The model's own multimodal inputs for these rows: pixels, grid and 3-D positions.
    stacked = {k: inputs[k] for k in ("input_ids", "attention_mask", "position_ids")}
    extra, _ = vision_inputs(model.model, [batch], stacked, torch.device("cpu"))
    with torch.no_grad():
        ours = model.forward_only(samples, adapter_name="vision")["logprobs"]
        logits = peft_model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], **extra
        ).logits
    labels = inputs["labels"]
    logprobs = torch.log_softmax(logits[:, :-1].float(), -1).gather(
        -1, labels[:, 1:].clamp_min(0)[..., None]
    )[..., 0]
    for row, expected in enumerate(ours):
        trained = (labels[row, 1:] != -100).nonzero()[:, 0]
        torch.testing.assert_close(
            logprobs[row, trained],
            torch.tensor(expected, dtype=torch.float32),
            rtol=1e-4,
            atol=1e-5,
        )


def test_images_on_a_text_only_base_are_refused():
    m = MultiLoraTransformersModel("tiny://qwen3.5")
    m.add_adapter_to_model("a", {"r": 2})
    batch = {
        "input_ids": torch.tensor([[1, 2, 3]]),
        "labels": torch.tensor([[1, 2, 3]]),
        "pixel_values": torch.zeros(16, 384),
        "image_grid_thw": torch.tensor([[1, 4, 4]]),
    }
    with pytest.raises(InvalidArgumentError, match="no vision tower"):
        m.forward_backward(batch)
    assert all(p.grad is None for p in m.tenants["a"].params)
