"""Shared data for the multimodal tests: trajectories with drawn images, and text-only ones."""

from __future__ import annotations

import pytest

from twinkle.dataset._self_cognition_vl import draw, rows
from twinkle.preprocessor import SelfCognitionProcessor

VL_MODEL = "tiny://qwen3.5-vl"


def image_trajectories(n: int, start: int = 0) -> list[dict]:
    """``n`` rows of ``builtin://self-cognition-vl`` as trajectories (one image each)."""
    fill = SelfCognitionProcessor("Twinkle", "ModelScope")
    return [fill.process(row) for row in rows()[start : start + n]]


def text_trajectories(n: int) -> list[dict]:
    """``n`` text-only user/assistant exchanges of different lengths."""
    return [
        {
            "messages": [
                {"role": "user", "content": f"Count to {i + 2}, please."},
                {"role": "assistant", "content": " ".join(str(k) for k in range(1, i + 3)) + "."},
            ]
        }
        for i in range(n)
    ]


def two_image_trajectory() -> dict:
    """One user turn with two pictures of different sizes between text parts."""
    return {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare "},
                    {"type": "image", "image": draw("circle", "red")},
                    {"type": "text", "text": " and "},
                    {"type": "image", "image": draw("square", "blue", size=48)},
                ],
            },
            {"role": "assistant", "content": "A red circle and a blue square."},
        ]
    }


@pytest.fixture(scope="session")
def vl_template():
    from twinkle.template import Qwen3_5Template

    return Qwen3_5Template(model_id=VL_MODEL)
