"""Images in requests: checked before anything runs, so a bad image is a 400 naming its field.

Images reach the server inside the request, as ``data:image/...;base64,`` URIs (or bare base64)
in a trajectory's image parts (``twinkle_client`` encodes bytes, PIL images and local paths so),
or already processed as an encoded feature's ``pixel_values`` / ``image_grid_thw``. A path is
refused: the server never reads a file a client names. Each image is checked here: its encoded
size, that PIL can identify it, that its header's pixel count is within the limit (a
decompression bomb is refused before its pixels are decoded), and that it decodes completely.
A request carries at most ``max_images`` images.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from twinkle.server.web.errors import BadRequest

_DATA_URI_MARK = ";base64,"


@dataclass(frozen=True)
class ImageLimits:
    """What one request may carry.

    Attributes:
        max_image_bytes: Largest encoded image (after base64 decoding).
        max_image_pixels: Largest decoded image, ``width * height``.
        max_images: Most images in one request (over all its inputs).
        max_patches: Most ``pixel_values`` rows in one request's encoded features.
    """

    max_image_bytes: int = 4 * 1024 * 1024  # under the 8 MiB request body limit
    max_image_pixels: int = 4096 * 4096
    max_images: int = 64
    max_patches: int = 65536


DEFAULT_LIMITS = ImageLimits()


def check_request_images(inputs: Any, limits: ImageLimits = DEFAULT_LIMITS) -> int:
    """Check every image of a request's ``inputs`` (a list of trajectories / features / token
    lists); returns how many images it holds.

    Raises:
        BadRequest: A path instead of image data, bad base64, an oversized, corrupt or
            truncated image, a decompression bomb, too many images, or inconsistent
            ``pixel_values`` / ``image_grid_thw``; the message names the field.
    """
    items = [inputs] if isinstance(inputs, Mapping) else inputs
    if not isinstance(items, list):
        return 0
    count = patches = 0
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        for where, value in _image_parts(item, f"inputs[{i}]"):
            count += 1
            if count > limits.max_images:
                raise BadRequest(
                    f"{where}: the request carries more than {limits.max_images} images "
                    f"(max_images per request)"
                )
            check_image(value, where, limits)
        if item.get("pixel_values") is not None or item.get("image_grid_thw") is not None:
            images, rows = _check_feature(item, f"inputs[{i}]")
            count += images
            patches += rows
            if count > limits.max_images or patches > limits.max_patches:
                raise BadRequest(
                    f"inputs[{i}].pixel_values: the request carries {count} images / {patches} "
                    f"patches, more than {limits.max_images} / {limits.max_patches}"
                )
    return count


def _image_parts(item: Mapping, where: str):
    messages = item.get("messages")
    if not isinstance(messages, list):
        return
    for j, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for k, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") == "image":
                value = next(
                    (part[key] for key in ("image", "bytes", "base64", "path") if part.get(key)),
                    None,
                )
                yield f"{where}.messages[{j}].content[{k}].image", value


def check_image(value: Any, where: str, limits: ImageLimits = DEFAULT_LIMITS) -> None:
    """Check one image given as a data URI or base64 string.

    Raises:
        BadRequest: Naming ``where``.
    """
    check_image_bytes(_image_bytes(value, where, limits), where, limits)


def check_image_bytes(data: bytes, where: str, limits: ImageLimits = DEFAULT_LIMITS) -> None:
    """Check one encoded image file (size, header pixel count, a full decode).

    Raises:
        BadRequest: Naming ``where``.
    """
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise BadRequest(f"{where}: empty image")
    if len(data) > limits.max_image_bytes:
        raise BadRequest(
            f"{where}: the image is {len(data)} bytes, more than {limits.max_image_bytes} "
            "(max_image_bytes)"
        )
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > limits.max_image_pixels:
                raise BadRequest(
                    f"{where}: {width}x{height} is {width * height} pixels, more than "
                    f"{limits.max_image_pixels} (max_image_pixels)"
                )
            image.load()  # corrupt or truncated pixel data fails here
    except BadRequest:
        raise
    except Image.DecompressionBombError as exc:
        raise BadRequest(f"{where}: refused as a decompression bomb ({exc})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise BadRequest(f"{where}: not a readable image ({exc})") from None


def _image_bytes(value: Any, where: str, limits: ImageLimits) -> bytes:
    if not isinstance(value, str) or not value:
        raise BadRequest(
            f"{where}: send the image as a data URI (data:image/png;base64,...) or base64 "
            f"string, got {type(value).__name__}"
        )
    text = value
    if value.startswith("data:"):
        if _DATA_URI_MARK not in value:
            raise BadRequest(f"{where}: a data URI must be base64 (data:image/...;base64,...)")
        text = value.split(_DATA_URI_MARK, 1)[1]
    # base64 is 4/3 of the data: refuse an oversized image before decoding it.
    if len(text) * 3 // 4 > limits.max_image_bytes + 3:
        raise BadRequest(
            f"{where}: the image is about {len(text) * 3 // 4} bytes, more than "
            f"{limits.max_image_bytes} (max_image_bytes)"
        )
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(
            f"{where}: not image data (a data URI or base64); the server does not read paths"
        ) from None
    if not data:
        raise BadRequest(f"{where}: empty image")
    if len(data) > limits.max_image_bytes:
        raise BadRequest(
            f"{where}: the image is {len(data)} bytes, more than {limits.max_image_bytes} "
            "(max_image_bytes)"
        )
    return data


def _check_feature(item: Mapping, where: str) -> tuple[int, int]:
    """An encoded feature's images: ``pixel_values`` ``[patches, dim]`` of finite numbers and
    ``image_grid_thw`` ``[images, 3]`` positive ints whose patches add up to the rows."""
    try:
        pixels = np.asarray(item.get("pixel_values"), dtype=np.float32)
    except (TypeError, ValueError):
        raise BadRequest(f"{where}.pixel_values: not a [patches, dim] list of numbers") from None
    try:
        grid = np.asarray(item.get("image_grid_thw"), dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise BadRequest(f"{where}.image_grid_thw: not an [images, 3] list of ints") from None
    if grid.ndim != 2 or grid.shape[1] != 3 or not len(grid) or (grid <= 0).any():
        raise BadRequest(f"{where}.image_grid_thw: expected [images, 3] positive ints")
    if pixels.ndim != 2 or not np.isfinite(pixels).all():
        raise BadRequest(f"{where}.pixel_values: expected [patches, dim] finite numbers")
    if int(grid.prod(-1).sum()) != pixels.shape[0]:
        raise BadRequest(
            f"{where}.pixel_values: {pixels.shape[0]} rows, but image_grid_thw "
            f"{grid.tolist()} asks for {int(grid.prod(-1).sum())} patches"
        )
    return len(grid), pixels.shape[0]
