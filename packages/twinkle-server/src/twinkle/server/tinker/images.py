"""Tinker ``ImageChunk``s in a ``ModelInput``: checked, processed with the base model's image
processor, and laid out as the model reads them.

An image chunk becomes ``<|image_pad|>`` once per image token (``t * h * w / merge**2`` of the
image's patch grid, as ``Template.encode`` makes them), and its pixels go along as the feature's
``pixel_values`` / ``image_grid_thw``. The chunk's length in the SDK's accounting
(``ModelInput.length``, the length the datum's ``loss_fn_inputs`` must have) is that token
count: ``expected_tokens``, when given, must equal it, else the request is a 400 naming the
chunk. The chunk is only the image: ``<|vision_start|>`` / ``<|vision_end|>`` are the
renderer's text around it, as in Qwen's chat template.

``ImageAssetPointerChunk`` (a ``location`` path or URL) is refused: the SDK does not say how a
server resolves it, and this server fetches nothing and reads no path a client names.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twinkle.server.images import DEFAULT_LIMITS, check_image_bytes
from twinkle.server.tinker.wire import WireDatum
from twinkle.server.web.errors import BadRequest

_FORMATS = ("png", "jpeg")


@dataclass
class ProcessedImages:
    """A prompt's images, processed: pixels, grid and the image tokens of each."""

    pixel_values: np.ndarray
    image_grid_thw: np.ndarray
    tokens_per_image: list[int]
    image_token_id: int


def _vision(base_model: str) -> tuple[Any, int]:
    """The base model's image processor and ``<|image_pad|>`` id.

    Raises:
        BadRequest: The base model reads no images.
    """
    from twinkle.hub import resolve_model_dir
    from twinkle.template._vision import load_image_processor

    processor = load_image_processor(base_model)
    config_path = Path(resolve_model_dir(base_model)) / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    token = config.get("image_token_id")
    if processor is None or token is None:
        raise BadRequest(
            f"image chunks: the base model {base_model} reads no images (serve a multimodal "
            "model such as tiny://qwen3.5-vl)"
        )
    return processor, int(token)


def process(
    images: list[tuple[bytes, str, int | None]], base_model: str, where: list[str]
) -> ProcessedImages:
    """Check and process ``images`` (bytes, format, expected_tokens), ``where[k]`` naming each.

    Raises:
        BadRequest: A bad format, an image that fails ``twinkle.server.images``, more images
            than allowed, or ``expected_tokens`` that differ from the image's token count.
    """
    from twinkle.data_format import ImagePart
    from twinkle.template._vision import process_images

    if len(images) > DEFAULT_LIMITS.max_images:
        raise BadRequest(
            f"{where[DEFAULT_LIMITS.max_images]}: more than {DEFAULT_LIMITS.max_images} images "
            "in one request (max_images)"
        )
    processor, token = _vision(base_model)
    for (data, fmt, _), at in zip(images, where):
        if fmt not in _FORMATS:
            raise BadRequest(f"{at}.format: {fmt!r} is not one of {list(_FORMATS)}")
        check_image_bytes(data, at)
    grids, pixels, counts = [], [], []
    for (data, _, expected), at in zip(images, where):
        try:
            out = process_images(processor, [ImagePart(image=data)])
        except ValueError as exc:
            raise BadRequest(f"{at}: {exc}") from None
        count = out.tokens_per_image[0]
        if expected is not None and expected != count:
            raise BadRequest(
                f"{at}.expected_tokens is {expected}, but this image takes {count} tokens on "
                f"{base_model}"
            )
        grids.append(out.image_grid_thw)
        pixels.append(out.pixel_values)
        counts.append(count)
    return ProcessedImages(np.concatenate(pixels), np.concatenate(grids), counts, token)


def _laid_out(
    text: list[int], positions: list[int], done: ProcessedImages
) -> tuple[list[int], list[int]]:
    """``text`` with each image's tokens inserted at its position; also each image's start."""
    tokens: list[int] = []
    starts, last = [], 0
    for at, count in zip(positions, done.tokens_per_image):
        tokens.extend(text[last:at])
        starts.append(len(tokens))
        tokens.extend([done.image_token_id] * count)
        last = at
    tokens.extend(text[last:])
    return tokens, starts


def expand_datums(data: list[WireDatum], base_model: str) -> list[WireDatum]:
    """Datums with their image chunks laid out as image tokens, pixels attached."""
    for i, datum in enumerate(data):
        if not datum.images:
            continue
        where = [f"data[{i}].model_input.image[{k}]" for k in range(len(datum.images) + 1)]
        done = process(
            [(data_, fmt, expected) for _, data_, fmt, expected in datum.images], base_model, where
        )
        datum.tokens, _ = _laid_out(datum.tokens, [at for at, *_ in datum.images], done)
        datum.pixel_values, datum.image_grid_thw = done.pixel_values, done.image_grid_thw
        datum.images = []
    return data


def prompt_inputs(prompt: Any, base_model: str) -> tuple[list[int], dict[str, Any] | None]:
    """A JSON ``ModelInput`` (sampling): its tokens, and ``{'pixel_values', 'image_grid_thw'}``
    when it has image chunks.

    Raises:
        BadRequest: Naming ``prompt.chunks[i]``.
    """
    from twinkle.server.tinker import convert

    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list) or not any(
        isinstance(c, dict) and c.get("type") in ("image", "image_asset_pointer") for c in chunks
    ):
        return convert.prompt_tokens(prompt or {}), None
    text_chunks, images, positions, where, count = [], [], [], [], 0
    for i, chunk in enumerate(chunks):
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        if kind == "image_asset_pointer":
            raise BadRequest(
                f"prompt.chunks[{i}]: image_asset_pointer chunks are not resolved by this server "
                "(it fetches no URL and reads no path); send the image bytes as an ImageChunk"
            )
        if kind != "image":
            text = convert.prompt_tokens({"chunks": [chunk]})
            text_chunks.extend(text)
            count += len(text)
            continue
        raw = chunk.get("data")
        try:
            data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
        except (binascii.Error, ValueError):
            raise BadRequest(f"prompt.chunks[{i}].data: not base64 image bytes") from None
        expected = chunk.get("expected_tokens")
        if expected is not None and (not isinstance(expected, int) or isinstance(expected, bool)):
            raise BadRequest(f"prompt.chunks[{i}].expected_tokens must be an integer")
        images.append((data, chunk.get("format"), expected))
        positions.append(count)
        where.append(f"prompt.chunks[{i}]")
    where.append(f"prompt.chunks[{len(chunks)}]")
    done = process(images, base_model, where)
    tokens, _ = _laid_out(text_chunks, positions, done)
    return tokens, {
        "pixel_values": done.pixel_values.tolist(),
        "image_grid_thw": done.image_grid_thw.tolist(),
    }
