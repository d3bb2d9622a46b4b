"""Server-side image checks (fast, no model): twinkle.server.images on request inputs, the Tinker
image-chunk layout and token accounting (twinkle.server.tinker.images), and the client inlining
images into the request (twinkle_client._wire)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from tests.twinkle.multimodal.conftest import VL_MODEL
from twinkle.dataset._self_cognition_vl import draw
from twinkle.server.images import ImageLimits, check_request_images
from twinkle.server.web.errors import BadRequest


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _row(*images) -> dict:
    parts = [{"type": "image", "image": value} for value in images]
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "?"}]}]}


GOOD = _uri(_png(draw("circle", "red")))


def test_good_images_are_counted():
    assert check_request_images([_row(GOOD, GOOD), {"input_ids": [1, 2]}, _row(GOOD)]) == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/etc/hostname", "does not read paths"),
        ("data:image/png,abc", "must be base64"),
        (_uri(_png(draw("circle", "red"))[:50]), "not a readable image"),
        (_uri(b"GIF89a" + b"\0" * 20), "not a readable image"),
        (_uri(_png(__import__("PIL.Image").Image.new("1", (5000, 5000)))), "more than 16777216"),
        (_uri(b"\0" * (64 * 1024)), "max_image_bytes"),
        (12, "got int"),
    ],
)
def test_bad_images_name_their_field(value, message):
    limits = ImageLimits(max_image_bytes=32 * 1024)
    with pytest.raises(BadRequest, match=message) as info:
        check_request_images([_row(GOOD), _row(GOOD, value)], limits)
    assert "inputs[1].messages[0].content[1].image" in str(info.value)


def test_image_count_and_feature_checks():
    with pytest.raises(BadRequest, match=r"inputs\[2\].*max_images"):
        check_request_images([_row(GOOD)] * 3, ImageLimits(max_images=2))
    ok = {
        "input_ids": [1],
        "pixel_values": np.zeros((16, 4)).tolist(),
        "image_grid_thw": [[1, 4, 4]],
    }
    assert check_request_images([ok]) == 1
    for bad, message in [
        ({**ok, "image_grid_thw": [[1, 8, 8]]}, "asks for 64 patches"),
        ({**ok, "image_grid_thw": [[1, 0, 4]]}, "positive ints"),
        ({**ok, "pixel_values": [[float("nan")] * 4] * 16}, "finite"),
        ({"input_ids": [1], "pixel_values": ok["pixel_values"]}, "image_grid_thw"),
    ]:
        with pytest.raises(BadRequest, match=message):
            check_request_images([bad])


def test_tinker_prompt_lays_out_image_tokens_and_checks_expected_tokens():
    from twinkle.server.tinker.images import prompt_inputs

    data = base64.b64encode(_png(draw("square", "blue", size=48))).decode()
    prompt = {
        "chunks": [
            {"type": "encoded_text", "tokens": [5, 6]},
            {"type": "image", "data": data, "format": "png", "expected_tokens": 9},
            {"type": "encoded_text", "tokens": [7]},
        ]
    }
    tokens, images = prompt_inputs(prompt, VL_MODEL)
    assert tokens == [5, 6, *[4098] * 9, 7]  # a 48x48 picture: 6x6 patches, 3x3 merged tokens
    assert images["image_grid_thw"] == [[1, 6, 6]] and len(images["pixel_values"]) == 36
    prompt["chunks"][1]["expected_tokens"] = 4
    with pytest.raises(BadRequest, match=r"prompt.chunks\[1\].expected_tokens is 4.*9 tokens"):
        prompt_inputs(prompt, VL_MODEL)
    prompt["chunks"][1].update(expected_tokens=None, format="gif")
    with pytest.raises(BadRequest, match=r"prompt.chunks\[1\].format"):
        prompt_inputs(prompt, VL_MODEL)
    with pytest.raises(BadRequest, match="reads no images"):
        prompt_inputs(
            {"chunks": [{"type": "image", "data": data, "format": "png"}]}, "tiny://qwen3.5"
        )
    assert prompt_inputs({"chunks": [{"type": "encoded_text", "tokens": [1]}]}, VL_MODEL) == (
        [1],
        None,
    )


def test_the_client_inlines_paths_bytes_and_pil_images(tmp_path):
    from twinkle_client._wire import training_inputs

    picture = draw("circle", "red")
    path = tmp_path / "p.png"
    path.write_bytes(_png(picture))
    sent = training_inputs([_row(str(path), _png(picture), picture, GOOD)])
    images = [p["image"] for p in sent[0]["messages"][0]["content"] if p.get("type") == "image"]
    assert all(v.startswith("data:image/png;base64,") for v in images)
    assert len({base64.b64decode(v.split(",", 1)[1]) for v in images[:2]}) == 1  # the same file
    assert check_request_images(sent) == 4
    with pytest.raises(ValueError, match="no such file"):
        training_inputs([_row(str(tmp_path / "missing.png"))])


def test_rendering_for_sampler_replicas_keeps_the_images(vl_template):
    """With several sampler replicas the service renders trajectories itself: an image prompt
    goes on as tokens plus its pixels (it was tokens only, so replicas got pads without images)."""
    from tests.twinkle.multimodal.conftest import image_trajectories
    from twinkle.server.sampler.service import _render

    question = {"messages": image_trajectories(1)[0]["messages"][:1]}
    rendered = _render(vl_template, question)
    feature = vl_template.encode(question, add_generation_prompt=True)
    assert rendered["input_ids"] == feature["input_ids"].tolist()
    np.testing.assert_array_equal(rendered["pixel_values"], feature["pixel_values"])
    np.testing.assert_array_equal(rendered["image_grid_thw"], feature["image_grid_thw"])
    assert _render(vl_template, {"messages": [{"role": "user", "content": "hi"}]}) == list(
        vl_template.encode({"messages": [{"role": "user", "content": "hi"}]}, True)["input_ids"]
    )


def test_an_image_feature_becomes_a_datum_with_image_chunks_the_server_lays_out_alike():
    """ModelScope Twinkle's Tinker multimodal script: LazyDataset rows -> input_feature_to_datum.
    Each run of image tokens becomes an ImageChunk of the row's image file; the server's layout
    of that datum gives back the very tokens and pixels the dataset encoded."""
    from twinkle.data_format import Message, Trajectory
    from twinkle.dataset import DatasetMeta, LazyDataset
    from twinkle.server.common import input_feature_to_datum
    from twinkle.server.tinker.images import prompt_inputs

    rows = [{"image": _png(draw("square", "blue", size=48)), "text": "x^2"}]
    dataset = LazyDataset(DatasetMeta(data=rows))
    dataset.set_template("Qwen3_5Template", model_id=VL_MODEL, max_length=256)
    dataset.map(
        lambda row: Trajectory(
            messages=[
                Message(role="user", content="<image>Read it.", images=[row["image"]]),
                Message(role="assistant", content=row["text"]),
            ]
        )
    )
    dataset.encode()
    feature = dataset[0]
    assert feature["images"] == [rows[0]["image"]]
    datum = input_feature_to_datum(feature)
    kinds = [chunk.type for chunk in datum.model_input.chunks]
    assert kinds == ["encoded_text", "image", "encoded_text"]
    assert datum.model_input.length == len(feature["input_ids"]) - 1
    prompt = datum.model_input.model_dump(mode="json")
    tokens, images = prompt_inputs(prompt, VL_MODEL)
    assert tokens == feature["input_ids"][:-1].tolist()
    np.testing.assert_allclose(images["pixel_values"], feature["pixel_values"], atol=1e-6)
    # Pixels without their files cannot become a datum: said, not guessed.
    with pytest.raises(ValueError, match="image file"):
        input_feature_to_datum({k: v for k, v in feature.items() if k != "images"})
