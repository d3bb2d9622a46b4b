"""Images in templates: Qwen's vision placeholders, image decoding with limits, and the image
processor's ``pixel_values`` / ``image_grid_thw``.

A chat template renders each image as ``<|vision_start|><|image_pad|><|vision_end|>``, as
Qwen2-VL, Qwen3-VL and Qwen3.5 do. Encoding then repeats ``<|image_pad|>`` once per image token
(``t * h * w / merge_size**2`` for the image's patch grid), which is how the model's
``masked_scatter`` finds where each image's features go.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twinkle.data_format import ImagePart
from twinkle.env import TWINKLE_TRUST_REMOTE_CODE

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
IMAGE_PLACEHOLDER = f"{VISION_START}{IMAGE_PAD}{VISION_END}"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)

#: Largest decoded image accepted, in pixels (before the processor resizes it): refuses
#: decompression bombs before their pixels are decoded.
MAX_IMAGE_PIXELS = 4096 * 4096
#: Most images one sample may carry.
MAX_IMAGES_PER_SAMPLE = 16


@functools.lru_cache(maxsize=16)
def _image_processor_from_dir(model_dir: Path):
    if not (model_dir / "preprocessor_config.json").is_file():
        return None
    from transformers import AutoImageProcessor

    trust = TWINKLE_TRUST_REMOTE_CODE.get()
    try:
        # The PIL backend needs no torchvision; the tensors it makes are the same.
        return AutoImageProcessor.from_pretrained(model_dir, trust_remote_code=trust, backend="pil")
    except (TypeError, ValueError):
        return AutoImageProcessor.from_pretrained(model_dir, trust_remote_code=trust)


def load_image_processor(model_id: str):
    """The model's image processor (``preprocessor_config.json``), or ``None`` for a text-only
    model. Cached per model directory: treat it as read-only."""
    from twinkle.hub import resolve_model_dir

    return _image_processor_from_dir(resolve_model_dir(model_id).resolve())


def decode_image(part: ImagePart):
    """The part's image as an RGB PIL image.

    Raises:
        ValueError: The bytes are not an image PIL can read, or the image has more than
            ``MAX_IMAGE_PIXELS`` pixels.
    """
    from PIL import Image, UnidentifiedImageError

    image = part.image
    if not isinstance(image, Image.Image):
        try:
            image = Image.open(io.BytesIO(part.image_bytes()))
        except (UnidentifiedImageError, OSError) as exc:
            raise ValueError(f"image: not a readable image file ({exc})") from None
        except Image.DecompressionBombError as exc:
            raise ValueError(f"image: {exc}") from None
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(
            f"image: {width}x{height} has {width * height} pixels, more than "
            f"MAX_IMAGE_PIXELS={MAX_IMAGE_PIXELS}"
        )
    try:
        return image.convert("RGB")
    except OSError as exc:  # truncated or corrupt data shows up when the pixels are decoded
        raise ValueError(f"image: cannot decode the image data ({exc})") from None


@dataclass(frozen=True)
class ImageInputs:
    """One sample's images as the model takes them.

    Attributes:
        pixel_values: ``[patches, channels * temporal_patch * patch * patch]`` float32.
        image_grid_thw: ``[images, 3]`` int64 patch grid (time, height, width) per image.
        tokens_per_image: How many ``<|image_pad|>`` tokens each image takes.
    """

    pixel_values: np.ndarray
    image_grid_thw: np.ndarray
    tokens_per_image: list[int]


def process_images(processor: Any, parts: Sequence[ImagePart]) -> ImageInputs:
    """Decode and process one sample's images.

    Raises:
        ValueError: More than ``MAX_IMAGES_PER_SAMPLE`` images, or one that cannot be decoded.
    """
    if len(parts) > MAX_IMAGES_PER_SAMPLE:
        raise ValueError(
            f"content: {len(parts)} images in one sample, more than "
            f"MAX_IMAGES_PER_SAMPLE={MAX_IMAGES_PER_SAMPLE}"
        )
    out = processor(images=[decode_image(p) for p in parts], return_tensors="np")
    grid = np.asarray(out["image_grid_thw"], dtype=np.int64).reshape(-1, 3)
    merge = int(getattr(processor, "merge_size", 2))
    return ImageInputs(
        pixel_values=np.asarray(out["pixel_values"], dtype=np.float32),
        image_grid_thw=grid,
        tokens_per_image=[int(n) // (merge * merge) for n in grid.prod(-1)],
    )


def expand_image_pads(texts: list[str], tokens_per_image: Sequence[int]) -> list[str]:
    """Repeat the ``k``-th ``<|image_pad|>`` of ``texts`` (in order, across the list)
    ``tokens_per_image[k]`` times.

    Raises:
        ValueError: The texts hold another number of placeholders than there are images (e.g. a
            message whose text spells ``<|image_pad|>`` itself).
    """
    found = sum(text.count(IMAGE_PAD) for text in texts)
    if found != len(tokens_per_image):
        raise ValueError(
            f"content: {found} {IMAGE_PAD} placeholders for {len(tokens_per_image)} images; "
            f"message text must not contain {IMAGE_PAD} itself"
        )
    counts = iter(tokens_per_image)
    expanded = []
    for text in texts:
        pieces = text.split(IMAGE_PAD)
        out = pieces[0]
        for piece in pieces[1:]:
            out += IMAGE_PAD * next(counts) + piece
        expanded.append(out)
    return expanded


__all__ = [
    "IMAGE_PAD",
    "IMAGE_PLACEHOLDER",
    "MAX_IMAGES_PER_SAMPLE",
    "MAX_IMAGE_PIXELS",
    "VISION_END",
    "VISION_START",
    "VISION_TOKENS",
    "ImageInputs",
    "decode_image",
    "expand_image_pads",
    "load_image_processor",
    "process_images",
]
