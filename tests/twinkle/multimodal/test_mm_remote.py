"""Images through twinkle_client (issue 30 point 5): trajectories with image parts train and
sample on a live tiny://qwen3.5-vl server; a path, a corrupt, oversized or bomb image, or too
many images is a 400 naming the field, and the tenant's adapter is left as it was."""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "twinkle_client"))

from serving import KEYS, full_server  # noqa: E402

from tests.twinkle.multimodal.conftest import VL_MODEL, image_trajectories  # noqa: E402
from twinkle.dataset._self_cognition_vl import draw  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.filterwarnings("ignore")]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with full_server(tmp_path_factory.mktemp("mm"), model_id=VL_MODEL, sampler=True) as s:
        yield s


@pytest.fixture(scope="module")
def client(served):
    from twinkle_client import init_twinkle_client

    c = init_twinkle_client(base_url=served[0], api_key=KEYS["alice"], timeout=300)
    yield c
    c.close()


@pytest.fixture(scope="module")
def model(client):
    from twinkle_client.model import MultiLoraTransformersModel

    m = MultiLoraTransformersModel(model_id=VL_MODEL)
    m.add_adapter_to_model("default", {"r": 8, "lora_alpha": 16})
    m.set_template("Qwen3_5Template")
    m.set_optimizer("AdamW", lr=5e-2)
    return m


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _with_image(value) -> dict:
    return {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": value}]},
            {"role": "assistant", "content": "A shape."},
        ]
    }


def _post(model, op: str, inputs: list):
    import httpx

    return httpx.post(
        f"{model.client.base_url}{model.route}/{op}",
        json={"adapter_name": model._name(None), "inputs": inputs},
        headers={"Authorization": f"Bearer {KEYS['alice']}"},
        timeout=120,
    )


def test_images_train_through_the_client(model, tmp_path):
    """Bytes, PIL images and a client-side path all travel in the request; the loss falls."""
    rows = image_trajectories(4)
    picture = tmp_path / "p.png"
    picture.write_bytes(_png(draw("circle", "green")))
    rows[1]["messages"][0]["content"][0]["image"] = _png(draw("square", "red"))  # bytes
    rows[2]["messages"][0]["content"][0]["image"] = str(picture)  # read by the client
    losses = []
    for _ in range(4):
        losses.append(float(model.forward_backward(inputs=rows)["loss"]))
        model.clip_grad_and_step()
    assert losses[-1] < losses[0], losses


def test_bad_images_are_400s_that_change_nothing(model):
    from PIL import Image

    from twinkle_client.errors import TwinkleServerError

    rows = image_trajectories(2)
    before = model.forward_only(inputs=rows)["loss"]
    good = "data:image/png;base64," + base64.b64encode(_png(draw("circle", "red"))).decode()
    corrupt = _png(draw("circle", "red"))
    bomb = _png(Image.new("1", (5000, 5000)))  # 25 M pixels in a few KB
    cases = {
        "server does not read paths": "/etc/hostname",
        "not a readable image": base64.b64encode(corrupt[: len(corrupt) // 2]).decode(),
        "more than 16777216": base64.b64encode(bomb).decode(),
        "max_image_bytes": base64.b64encode(b"\0" * (5 * 1024 * 1024)).decode(),
    }
    for expected, value in cases.items():
        # Straight over HTTP: the client itself would read a path on its own machine.
        reply = _post(model, "forward_backward", [_with_image(value)])
        assert reply.status_code == 400, (expected, reply.text)
        assert "inputs[0].messages[0].content[0].image" in reply.text, reply.text
        assert expected in reply.text, reply.text
    many = [_with_image(good) for _ in range(65)]
    with pytest.raises(TwinkleServerError) as info:
        model.forward_backward(inputs=many)
    assert info.value.status == 400 and "inputs[64]" in str(info.value)
    assert "max_images" in str(info.value)
    # Nothing reached the adapter: no gradients were added, the weights are the same.
    assert model.forward_only(inputs=rows)["loss"] == pytest.approx(before, rel=1e-6)
    with pytest.raises(TwinkleServerError, match="has no gradients"):
        model.clip_grad_norm()


def test_images_sample_through_the_client(client, served):
    """The server samples an image prompt with the same log-probs as a local TorchSampler."""
    from twinkle.sampler import TorchSampler as LocalSampler
    from twinkle_client.sampler import TorchSampler

    remote = TorchSampler(VL_MODEL)
    remote.set_template("Qwen3_5Template")
    prompt = {"messages": image_trajectories(1, start=3)[0]["messages"][:1]}
    params = {"max_tokens": 4, "temperature": 0.0, "logprobs": True, "prompt_logprobs": True}
    got = remote.sample([prompt], params)[0]
    local = LocalSampler(VL_MODEL, device="cpu")
    local.set_template("Qwen3_5Template")
    want = local.sample([prompt], params)[0]
    assert got.prompt_tokens == want.prompt_tokens
    np.testing.assert_allclose(got.prompt_logprobs[1:], want.prompt_logprobs[1:], rtol=1e-4)
    assert got.sequences[0].tokens == want.sequences[0].tokens
    from twinkle_client.errors import TwinkleServerError

    bad = {"messages": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]}
    with pytest.raises(TwinkleServerError) as info:
        remote.client.call(remote.client.sampler_route(VL_MODEL), "sample", {"inputs": [bad]})
    assert info.value.status == 400
    assert "inputs[0].messages[0].content[0].image" in str(info.value)
