"""Sampling with images (issue 30 point 4): TorchSampler on tiny://qwen3.5-vl."""

from __future__ import annotations

import numpy as np
import pytest

from tests.twinkle.multimodal.conftest import VL_MODEL, image_trajectories, text_trajectories
from twinkle.errors import InvalidArgumentError

pytestmark = pytest.mark.filterwarnings("ignore")


def _prompt(trajectory: dict) -> dict:
    """The trajectory without its assistant turn: what the sampler completes."""
    return {"messages": [m for m in trajectory["messages"] if m["role"] != "assistant"]}


@pytest.fixture(scope="module")
def sampler():
    from twinkle.sampler import TorchSampler

    s = TorchSampler(VL_MODEL, device="cpu")
    s.set_template("Qwen3_5Template")
    return s


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory):
    """A vision-LoRA adapter trained a few steps on image rows, saved as PEFT."""
    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel(VL_MODEL)
    targets = ["q_proj", "v_proj", "qkv", "attn.proj", "linear_fc1", "linear_fc2"]
    model.add_adapter_to_model("v", {"r": 8, "target_modules": targets})
    model.set_template("Qwen3_5Template", adapter_name="v")
    model.set_optimizer("AdamW", lr=5e-2, adapter_name="v")
    rows = image_trajectories(4)
    for _ in range(3):
        model.forward_backward(inputs=rows, adapter_name="v")
        model.clip_grad_and_step(adapter_name="v")
    out = tmp_path_factory.mktemp("vl_adapter")
    model.save("v", output_dir=str(out), adapter_name="v")
    return str(out / "v") if (out / "v").exists() else str(out)


def test_image_prompt_logprobs_match_a_plain_forward(sampler):
    """Prompt log-probs of an image prompt equal the model's own forward over the same inputs,
    and the image changes them (the pixels reach the vision tower)."""
    import torch

    prompt = _prompt(image_trajectories(1)[0])
    res = sampler.sample([prompt], {"max_tokens": 0, "prompt_logprobs": True})[0]
    feature = sampler.template.encode(prompt, add_generation_prompt=True)
    ids = torch.tensor([feature["input_ids"]])
    with torch.no_grad():
        logits = sampler.model(
            input_ids=ids,
            pixel_values=torch.tensor(np.asarray(feature["pixel_values"])),
            image_grid_thw=torch.tensor(np.asarray(feature["image_grid_thw"])),
            mm_token_type_ids=(ids == sampler.model.config.image_token_id).int(),
        ).logits
    lps = torch.log_softmax(logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
    assert res.prompt_tokens == list(feature["input_ids"])
    np.testing.assert_allclose(res.prompt_logprobs[1:], lps.tolist(), rtol=1e-4, atol=1e-5)
    other = dict(feature)
    other["pixel_values"] = np.zeros_like(np.asarray(feature["pixel_values"]))
    res0 = sampler.sample([other], {"max_tokens": 0, "prompt_logprobs": True})[0]
    assert not np.allclose(res0.prompt_logprobs[1:], res.prompt_logprobs[1:], atol=1e-4)


def test_mixed_batch_equals_separate_sampling(sampler, trained_adapter):
    """A batch mixing a text prompt, image prompts and an adapter samples each row as a batch of
    its own would (greedy tokens and logprobs)."""
    prompts = [_prompt(t) for t in image_trajectories(2)] + [_prompt(text_trajectories(1)[0])]
    params = {"max_tokens": 6, "temperature": 0.0, "logprobs": True}
    uris = [trained_adapter, None, trained_adapter]
    together = sampler.sample(prompts, params, adapter_uri=uris)
    for prompt, uri, got in zip(prompts, uris, together):
        alone = sampler.sample([prompt], params, adapter_uri=[uri])[0]
        assert got.sequences[0].tokens == alone.sequences[0].tokens
        np.testing.assert_allclose(
            got.sequences[0].logprobs, alone.sequences[0].logprobs, rtol=1e-4, atol=1e-5
        )
    base = sampler.sample([prompts[0]], {**params, "max_tokens": 0, "prompt_logprobs": True})
    tuned = sampler.sample(
        [prompts[0]], {**params, "max_tokens": 0, "prompt_logprobs": True}, trained_adapter
    )
    assert not np.allclose(base[0].prompt_logprobs[1:], tuned[0].prompt_logprobs[1:], atol=1e-4)


def test_decode_steps_equal_full_recompute(sampler):
    """Cached decoding moves the 3-D positions on exactly as a full recompute does."""
    prompt = _prompt(image_trajectories(1, start=5)[0])
    params = {"max_tokens": 5, "temperature": 0.0, "logprobs": True}
    cached = sampler.sample([prompt], params)[0].sequences[0]
    sampler.uses_cache = False
    try:
        full = sampler.sample([prompt], params)[0].sequences[0]
    finally:
        sampler.uses_cache = True
    assert cached.tokens == full.tokens
    np.testing.assert_allclose(cached.logprobs, full.logprobs, rtol=1e-4, atol=1e-5)


def test_images_refused_clearly(sampler):
    feature = sampler.template.encode(_prompt(image_trajectories(1)[0]), True)
    with pytest.raises(InvalidArgumentError, match="pixel_values"):
        sampler.sample([{"input_ids": feature["input_ids"], "image_grid_thw": [[1, 2, 2]]}])
    with pytest.raises(InvalidArgumentError, match="image_grid_thw"):
        sampler.sample([{**feature, "image_grid_thw": [[1, 8, 8]]}], {"max_tokens": 1})
    pixels = np.asarray(feature["pixel_values"])  # the right patch count, too many pad tokens
    grid = np.asarray(feature["image_grid_thw"])
    with pytest.raises(InvalidArgumentError, match="image_pad"):
        sampler.sample(
            [
                {
                    "input_ids": list(feature["input_ids"]) * 2,
                    "pixel_values": pixels,
                    "image_grid_thw": grid,
                }
            ]
        )


def test_text_only_model_refuses_images():
    from twinkle.sampler import TorchSampler

    s = TorchSampler("tiny://qwen3.5", device="cpu")
    pixels = np.zeros((4, 3 * 2 * 8 * 8), dtype=np.float32)
    with pytest.raises(InvalidArgumentError, match="vision tower"):
        s.sample([{"input_ids": [1, 2, 3], "pixel_values": pixels, "image_grid_thw": [[1, 2, 2]]}])
