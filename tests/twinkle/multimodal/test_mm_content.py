"""Message content as text and image parts (twinkle.data_format, shared with the client)."""

import base64
import io

import pydantic
import pytest
from PIL import Image

import twinkle_client.data_format as client
from twinkle.data_format import ImagePart, Message, TextPart, Trajectory
from twinkle.dataset._self_cognition_vl import draw


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_local_and_client_share_the_part_types():
    assert client.ImagePart is ImagePart and client.TextPart is TextPart


def test_every_image_spelling_gives_the_same_bytes(tmp_path):
    image = draw("circle", "red")
    data = _png(image)
    path = tmp_path / "red.png"
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    spellings = [
        {"type": "image", "image": data},
        {"type": "image", "image": str(path)},
        {"type": "image", "image": path},
        {"type": "image", "path": str(path)},
        {"type": "image", "bytes": data},
        {"type": "image", "base64": b64},
        {"type": "image", "image": b64},
        {"type": "image", "image": f"data:image/png;base64,{b64}"},
    ]
    for spelling in spellings:
        part = Message(role="user", content=[spelling]).images[0]
        assert part.image_bytes() == data, spelling
    # A PIL image is kept as it is and saved as PNG for the wire.
    pil_part = Message(role="user", content=[{"type": "image", "image": image}]).images[0]
    assert pil_part.image is image
    assert Image.open(io.BytesIO(pil_part.image_bytes())).tobytes() == image.tobytes()


def test_json_round_trip_carries_bytes_as_a_data_uri():
    data = _png(draw("square", "blue"))
    message = Message(
        role="user",
        content=[{"type": "image", "image": data}, {"type": "text", "text": "What is it?"}],
    )
    wire = message.model_dump(mode="json")
    assert wire["content"][0]["image"].startswith("data:image/png;base64,")
    back = Message.model_validate(wire)
    assert back.images[0].image_bytes() == data
    assert back.text == "What is it?"


@pytest.mark.parametrize(
    "part, field",
    [
        ({"type": "image", "image": "https://example.com/cat.png"}, "URLs are not fetched"),
        ({"type": "image", "image": b""}, "empty bytes"),
        ({"type": "image", "image": "   "}, "empty string"),
        ({"type": "image", "image": 3}, "expected a path"),
        ({"type": "image"}, "image"),
        ({"type": "video", "video": "x"}, "type"),
        ({"text": "no type"}, "type"),
    ],
)
def test_bad_parts_are_refused_naming_the_field(part, field):
    with pytest.raises(pydantic.ValidationError, match=field):
        Message(role="user", content=[part])


def test_missing_file_is_reported_when_read():
    part = ImagePart(image="no/such/picture.png")
    with pytest.raises(ValueError, match="no such file"):
        part.image_bytes()


def test_assistant_turns_cannot_hold_images():
    with pytest.raises(pydantic.ValidationError, match="assistant message cannot hold images"):
        Message(role="assistant", content=[{"type": "image", "image": b"\x89PNG"}])
    assert Message(role="assistant", content=[{"type": "text", "text": "ok"}]).text == "ok"


def test_string_content_is_unchanged_and_images_are_listed_in_order():
    assert Message(role="user", content="hi").images == []
    a, b = _png(draw("circle", "red")), _png(draw("square", "green"))
    trajectory = Trajectory.coerce(
        {
            "messages": [
                {"role": "system", "content": [{"type": "image", "image": a}]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "and"}, {"type": "image", "image": b}],
                },
                {"role": "assistant", "content": "two shapes"},
            ]
        }
    )
    assert [p.image_bytes() for p in trajectory.images] == [a, b]


@pytest.mark.slow
def test_tiny_vl_model_builds_the_same_bytes_twice(tmp_path):
    from twinkle.hub import build_tiny_model

    first = build_tiny_model("qwen3.5-vl", tmp_path / "a")
    second = build_tiny_model("qwen3.5-vl", tmp_path / "b")
    for name in ("model.safetensors", "tokenizer.json", "preprocessor_config.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
