"""``builtin://self-cognition-vl``: a small multimodal self-cognition set, images drawn in code.

Each row is ``{'query', 'response', 'image'}``: a question about a picture of one coloured shape
(its colour, its shape, both, or who is looking at it), the answer, and the picture as a PNG
data URI. ``{{NAME}}`` and ``{{AUTHOR}}`` fill in as in ``builtin://self-cognition``
(``SelfCognitionProcessor``). Drawing is deterministic, so every machine builds the same bytes.
"""

from __future__ import annotations

import functools
import io
from typing import Any

from twinkle.data_format import ImagePart

SIZE = 32
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 60, 220)}
SHAPES = ("circle", "square", "triangle")

_QUESTIONS = (
    ("What colour is the shape?", "The shape is {colour}."),
    ("What shape is in the picture?", "It is a {shape}."),
    ("Describe the picture.", "A {colour} {shape} on a white background."),
    (
        "Who are you, and what do you see?",
        "I am {{NAME}}, an assistant built by {{AUTHOR}}. I see a {colour} {shape}.",
    ),
)


def draw(shape: str, colour: str, size: int = SIZE):
    """A ``size`` x ``size`` RGB picture of one ``colour`` ``shape`` on white."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    fill = COLOURS[colour]
    lo, hi = size // 8, size - size // 8
    if shape == "circle":
        pen.ellipse((lo, lo, hi, hi), fill=fill)
    elif shape == "square":
        pen.rectangle((lo, lo, hi, hi), fill=fill)
    elif shape == "triangle":
        pen.polygon([(size // 2, lo), (hi, hi), (lo, hi)], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")
    return image


def png_data_uri(image) -> str:
    """``image`` as a PNG ``data:`` URI (how the rows store it)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return ImagePart(image=buffer.getvalue()).model_dump(mode="json")["image"]


@functools.lru_cache(maxsize=1)
def _rows() -> tuple[dict[str, Any], ...]:
    rows = []
    for shape in SHAPES:
        for colour in COLOURS:
            image = png_data_uri(draw(shape, colour))
            for query, response in _QUESTIONS:
                rows.append(
                    {
                        "query": query,
                        "response": response.replace("{colour}", colour).replace("{shape}", shape),
                        "image": image,
                    }
                )
    return tuple(rows)


def rows() -> list[dict[str, Any]]:
    """The 36 rows (3 shapes x 3 colours x 4 questions), in a fixed order."""
    return [dict(row) for row in _rows()]


__all__ = ["COLOURS", "SHAPES", "SIZE", "draw", "png_data_uri", "rows"]
