"""Message / Trajectory read like upstream Twinkle's dicts, and images given as
``Message(images=[...])`` reach the template (nothing is dropped)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from twinkle.data_format import ImagePart, Message, TextPart, Trajectory

PNG_A = b"\x89PNG-a"
PNG_B = b"\x89PNG-b"


def test_images_become_parts_at_their_placeholders():
    message = Message(role="user", content="<image>Read this.", images=[PNG_A])
    assert message.content == [ImagePart(image=PNG_A), TextPart(text="Read this.")]
    middle = Message(role="user", content="A <image> and B <image>.", images=[PNG_A, PNG_B])
    assert [type(p).__name__ for p in middle.content] == [
        "TextPart",
        "ImagePart",
        "TextPart",
        "ImagePart",
        "TextPart",
    ]
    assert [p.image for p in middle.images] == [PNG_A, PNG_B]
    # Images without a placeholder go first, in order.
    lead = Message(role="user", content="Both?", images=[PNG_A, PNG_B])
    assert lead.content[:2] == [ImagePart(image=PNG_A), ImagePart(image=PNG_B)]
    assert lead.text == "Both?"
    # An empty images list changes nothing.
    assert Message(role="user", content="hi", images=[]).content == "hi"


def test_image_errors_are_clear():
    with pytest.raises(ValidationError, match="2 <image> placeholder"):
        Message(role="user", content="<image><image>", images=[PNG_A])
    with pytest.raises(ValidationError, match="assistant message cannot hold images"):
        Message(role="assistant", content="x", images=[PNG_A])


def test_images_survive_json_and_rebuilding():
    message = Message(role="user", content="<image>What?", images=[PNG_A])
    wire = json.loads(message.model_dump_json())
    assert wire["content"][0]["image"].startswith("data:image/png;base64,")
    again = Message.model_validate(wire)
    assert again.images[0].image_bytes() == PNG_A
    assert Message(**dict(message)) == message  # keys() lists no derived view twice


def test_message_reads_like_a_dict():
    message = Message(role="tool", content="42", tool_call_id="c1", name="calc")
    assert message["role"] == "tool" and message.get("content", "") == "42"
    assert message.get("tool_call_id") == "c1" and message.get("missing", 7) == 7
    assert "images" in message and message["images"] == [] and "nope" not in message
    with pytest.raises(KeyError):
        message["nope"]
    assert set(dict(message)) == {
        "role",
        "content",
        "reasoning_content",
        "tool_calls",
        "tool_call_id",
        "name",
    }
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
    assert Message(role="assistant", content="", tool_calls=[call]).tool_calls == [call]


def test_trajectory_keeps_tools_and_user_data():
    tools = [{"tool_name": "move", "description": "Play a move", "parameters": {}}]
    trajectory = Trajectory(
        messages=[Message(role="user", content="Go")],
        tools=tools,
        user_data=[("ground_truth", "4"), ("level", 5)],
    )
    assert trajectory.get("user_data") == [("ground_truth", "4"), ("level", 5)]
    assert trajectory["tools"] == tools
    assert {**trajectory}["messages"][0]["content"] == "Go"
    assert Trajectory().messages == [] and Trajectory().get("user_data") == []
    from_dict = Trajectory.coerce({"messages": [{"role": "user", "content": "x"}], "tools": tools})
    assert from_dict.tools == tools
    assert Trajectory(user_data={"answer": 3}).user_data == {"answer": 3}


def test_message_images_reach_the_template_like_parts_do(vl_template):
    from twinkle.dataset._self_cognition_vl import draw

    picture = draw("circle", "red")
    upstream_style = Trajectory(
        messages=[
            Message(role="user", content="<image>Which shape?", images=[picture]),
            Message(role="assistant", content="A circle."),
        ]
    )
    parts_style = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": picture},
                    {"type": "text", "text": "Which shape?"},
                ],
            },
            {"role": "assistant", "content": "A circle."},
        ]
    }
    ours, theirs = vl_template.batch_encode([upstream_style, parts_style])
    assert ours["pixel_values"] is not None and ours["pixel_values"].shape[0] > 0
    np.testing.assert_array_equal(ours["input_ids"], theirs["input_ids"])
    np.testing.assert_array_equal(ours["pixel_values"], theirs["pixel_values"])
    np.testing.assert_array_equal(ours["image_grid_thw"], theirs["image_grid_thw"])


@pytest.fixture(scope="module")
def vl_template():
    from twinkle.template import Qwen3_5Template

    return Qwen3_5Template(model_id="tiny://qwen3.5-vl")


def test_sampling_params_is_the_samplers_own_class():
    import twinkle_client.data_format as client_format
    from twinkle.data_format import SamplingParams
    from twinkle.sampler.types import SamplingParams as LocalSamplerParams
    from twinkle_client.sampler.types import SamplingParams as ClientSamplerParams

    assert SamplingParams is ClientSamplerParams is LocalSamplerParams
    assert client_format.SamplingParams is SamplingParams
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95)
    assert (params.max_tokens, params.top_p) == (16, 0.95)
    with pytest.raises(AttributeError):
        client_format.NoSuchName  # noqa: B018
