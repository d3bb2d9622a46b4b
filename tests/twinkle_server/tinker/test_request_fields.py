"""The Tinker protocol's one place for unknown fields: ``request_fields.parse`` reads a body as the
SDK's own request type, drops (and logs once) fields another SDK version sent, refuses values of
the wrong type with a 400 naming the field, and never coerces."""

from __future__ import annotations

import logging

import pytest
from tinker import types

from twinkle.server.tinker import request_fields
from twinkle.server.tinker.request_fields import parse
from twinkle.server.web.errors import BadRequest

PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]}


def _sample(**extra):
    return {
        "num_samples": 2,
        "prompt": PROMPT,
        "sampling_params": {"max_tokens": 4, "temperature": 1.0},
        "base_model": "Qwen/Qwen3-8B",
        **extra,
    }


def test_a_body_becomes_the_sdks_own_request_type():
    request = parse("asample", _sample())
    assert isinstance(request, types.SampleRequest)
    assert request.num_samples == 2
    assert request.sampling_params.max_tokens == 4
    assert request.prompt.to_ints() == [1, 2, 3]


def test_unknown_fields_at_any_depth_are_dropped_and_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(request_fields, "_logged", set())
    body = _sample(newer_top_level=1)
    body["prompt"] = {"chunks": [{**PROMPT["chunks"][0], "newer_chunk_field": True}]}
    with caplog.at_level(logging.WARNING, logger="twinkle.server.tinker"):
        first = parse("asample", body)
        again = parse("asample", body)
    assert first == again
    assert first.prompt.to_ints() == [1, 2, 3]
    warned = [r.getMessage() for r in caplog.records if "ignoring unknown field" in r.getMessage()]
    assert len(warned) == 2, warned
    assert any("'newer_top_level'" in m for m in warned)
    assert any("'prompt.chunks.newer_chunk_field'" in m for m in warned)
    # The caller's body is not changed in place.
    assert body["prompt"]["chunks"][0]["newer_chunk_field"] is True


def test_an_older_sdks_image_chunk_fields_are_dropped_inside_the_union():
    image = {
        "type": "image",
        "data": "aGVsbG8=",
        "format": "png",
        "expected_tokens": 4,
        "height": 8,  # sent by SDKs before 0.38
        "width": 8,
    }
    body = _sample(prompt={"chunks": [PROMPT["chunks"][0], image]})
    request = parse("asample", body)
    chunk = request.prompt.chunks[1]
    assert isinstance(chunk, types.ImageChunk)
    assert chunk.expected_tokens == 4


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_samples", "3"), ("num_samples", 2.5), ("base_model", 7)],
)
def test_a_value_of_the_wrong_type_is_a_400_naming_the_field(field, value):
    with pytest.raises(BadRequest) as info:
        parse("asample", _sample(**{field: value}))
    assert str(info.value).startswith("invalid asample request: ")
    assert field in str(info.value)


def test_a_missing_required_field_is_a_400_naming_it():
    body = _sample()
    del body["prompt"]
    with pytest.raises(BadRequest, match="prompt"):
        parse("asample", body)
