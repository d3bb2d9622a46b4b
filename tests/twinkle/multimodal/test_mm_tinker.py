"""The Tinker SDK with ``ImageChunk`` (issue 30 point 5) against a live tiny://qwen3.5-vl
server: forward_backward, forward and sampling take image chunks; the SDK's accounting (an
image chunk is ``expected_tokens`` long) lines up with the loss inputs; bad chunks are 400s."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "twinkle_client"))
sys.path.insert(0, str(ROOT / "twinkle_server" / "tinker"))

from sdk_version import adapt_creation_calls  # noqa: E402
from serving import KEYS, full_server  # noqa: E402

from tests.twinkle.multimodal.conftest import VL_MODEL  # noqa: E402
from twinkle.dataset._self_cognition_vl import draw  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.filterwarnings("ignore")]
BASE = "tiny/qwen3.5-vl"
adapt_creation_calls()


def png(shape: str = "circle", colour: str = "red", size: int = 32) -> bytes:
    buffer = io.BytesIO()
    draw(shape, colour, size=size).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from twinkle.hub import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir(VL_MODEL))


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from twinkle_client import init_tinker_client

    with full_server(tmp_path_factory.mktemp("mmtk"), model_id=VL_MODEL, sampler=True) as s:
        init_tinker_client()
        import tinker

        client = tinker.ServiceClient(base_url=s[0], api_key=KEYS["alice"])
        yield client
        if hasattr(client, "close"):
            client.close("success").result(timeout=30)


def image_prompt(tokenizer, image: bytes, expected: int | None = 4):
    """``user: <image> What is it?`` then the assistant header, as Qwen's template lays it out
    (the image chunk sits between <|vision_start|> and <|vision_end|>)."""
    from tinker import types

    before = tokenizer.encode("<|im_start|>user\n<|vision_start|>")
    after = tokenizer.encode("<|vision_end|>What is it?<|im_end|>\n<|im_start|>assistant\n")
    return [
        types.EncodedTextChunk(tokens=before),
        types.ImageChunk(data=image, format="png", expected_tokens=expected),
        types.EncodedTextChunk(tokens=after),
    ]


def sft_datum(tokenizer, image: bytes, answer: str, expected: int = 4):
    from tinker import types

    chunks = image_prompt(tokenizer, image, expected)
    reply = tokenizer.encode(answer + "<|im_end|>")
    prompt_len = types.ModelInput(chunks=chunks).length
    chunks = [*chunks[:-1], types.EncodedTextChunk(tokens=chunks[-1].tokens + reply)]
    model_input = types.ModelInput(chunks=chunks)
    n = model_input.length  # image chunks count expected_tokens, as the SDK counts them
    # Targets are the next tokens; the image positions carry none (weight 0).
    targets = [0] * n
    flat = chunks[-1].tokens
    targets[n - len(flat) : n - 1] = flat[1:]
    weights = [0.0] * n
    weights[prompt_len - 1 : n - 1] = [1.0] * (n - prompt_len)
    targets[prompt_len - 1] = reply[0]
    return types.Datum(
        model_input=model_input, loss_fn_inputs={"target_tokens": targets, "weights": weights}
    )


def test_image_chunks_train_forward_and_sample(service, tokenizer):
    from tinker import types

    client = service.create_lora_training_client(base_model=BASE, rank=8).result(timeout=120)
    data = [
        sft_datum(tokenizer, png("circle", "red"), "A red circle."),
        sft_datum(tokenizer, png("square", "blue", 48), "A blue square.", 9),  # 3x3 merged
    ]
    assert data[1].model_input.length == len(data[1].loss_fn_inputs["weights"].data)
    losses = []
    for _ in range(4):
        fwd = client.forward_backward(data, "cross_entropy").result(timeout=120)
        client.optim_step(types.AdamParams(learning_rate=5e-2)).result(timeout=120)
        losses.append(fwd.metrics["loss:sum"])
    assert losses[-1] < losses[0], losses
    out = client.forward(data, "cross_entropy").result(timeout=120)
    assert [len(o["logprobs"].tolist()) for o in out.loss_fn_outputs] == [
        d.model_input.length for d in data
    ]
    # The pixels matter: another picture in the same datum scores the answer differently.
    other = sft_datum(tokenizer, png("triangle", "green"), "A red circle.")
    out2 = client.forward([other], "cross_entropy").result(timeout=120)
    assert out2.metrics["loss:sum"] != pytest.approx(
        client.forward([data[0]], "cross_entropy").result(timeout=120).metrics["loss:sum"],
        rel=1e-6,
    )
    # Sampling with the image: prompt logprobs equal the local TorchSampler's on the same input.
    sampler = client.save_weights_and_get_sampling_client()
    prompt = types.ModelInput(chunks=image_prompt(tokenizer, png("circle", "red")))
    params = types.SamplingParams(max_tokens=4, temperature=0.0, seed=1)
    result = sampler.sample(
        prompt, num_samples=1, sampling_params=params, include_prompt_logprobs=True
    ).result(timeout=120)
    assert len(result.prompt_logprobs) == prompt.length and result.sequences[0].tokens
    base = service.create_sampling_client(base_model=BASE)
    base_lp = base.compute_logprobs(prompt).result(timeout=120)
    from twinkle.sampler import TorchSampler
    from twinkle.template import Qwen3_5Template

    local = TorchSampler(VL_MODEL, device="cpu")
    trajectory = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": png()},
                    {"type": "text", "text": "What is it?"},
                ],
            }
        ]
    }
    feature = Qwen3_5Template(model_id=VL_MODEL).encode(trajectory, add_generation_prompt=True)
    want = local.sample([feature], {"max_tokens": 0, "prompt_logprobs": True})[0]
    assert len(want.prompt_tokens) == prompt.length
    np.testing.assert_allclose(base_lp[1:], want.prompt_logprobs[1:], rtol=1e-4, atol=1e-5)


def test_bad_image_chunks_are_400s(service, tokenizer):
    import tinker
    from tinker import types

    client = service.create_lora_training_client(base_model=BASE, rank=4).result(timeout=120)
    wrong = sft_datum(tokenizer, png(), "A red circle.")
    chunk = wrong.model_input.chunks[1]
    wrong.model_input.chunks[1] = chunk.model_copy(update={"expected_tokens": 9})
    with pytest.raises(tinker.BadRequestError, match=r"expected_tokens is 9.*takes 4 tokens"):
        client.forward_backward([wrong], "cross_entropy").result(timeout=60)
    sampler = service.create_sampling_client(base_model=BASE)
    corrupt = types.ModelInput(chunks=image_prompt(tokenizer, png()[:60]))
    with pytest.raises(tinker.BadRequestError, match=r"prompt.chunks\[1\].*not a readable image"):
        sampler.sample(corrupt, 1, types.SamplingParams(max_tokens=2)).result(timeout=60)
    pointer = types.ModelInput(
        chunks=[
            types.EncodedTextChunk(tokens=[5, 6]),
            types.ImageAssetPointerChunk(format="png", location="/etc/hostname", expected_tokens=4),
        ]
    )
    with pytest.raises(tinker.BadRequestError, match="image_asset_pointer"):
        sampler.sample(pointer, 1, types.SamplingParams(max_tokens=2)).result(timeout=60)
