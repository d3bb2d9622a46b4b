"""Parts of a multimodal message: text and images.

A message's ``content`` is either a string or a list of parts, ``{"type": "text", "text": ...}``
and ``{"type": "image", "image": ...}``, in the order the model reads them. An image is given as
a local path, the encoded file bytes (PNG, JPEG, ...), a base64 string (plain or a
``data:image/...;base64,`` URI) or a PIL image. URLs are refused: nothing is fetched from the
network, so a sample means the same thing on every machine.

This module imports no imaging library; PIL is only used, when installed, to serialise a PIL
image for the wire.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_serializer, field_validator, model_validator

_URL_PREFIXES = ("http://", "https://", "ftp://", "s3://", "oss://")
_DATA_URI_MARK = ";base64,"
# Long enough not to mistake a short relative file name for base64.
_BASE64 = re.compile(r"[A-Za-z0-9+/]{16,}={0,2}")


class TextPart(BaseModel):
    """A piece of text inside a multimodal message."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["text"] = "text"
    text: str


def _is_pil_image(value: Any) -> bool:
    # Duck-typed so the client never imports PIL: a PIL image has these three members.
    return all(hasattr(value, name) for name in ("mode", "size", "save"))


class ImagePart(BaseModel):
    """An image inside a multimodal message.

    Attributes:
        image: A local file path (``str`` or ``os.PathLike``), the encoded image bytes, a
            base64 string (``data:image/png;base64,...`` or bare base64) or a PIL image.

    ``{"type": "image", "path": ...}``, ``{"type": "image", "bytes": ...}`` and
    ``{"type": "image", "base64": ...}`` are accepted as spellings of the same field.

    Raises:
        pydantic.ValidationError: An empty value, a URL, or a value of another type.
    """

    model_config = ConfigDict(extra="ignore", frozen=True, arbitrary_types_allowed=True)

    type: Literal["image"] = "image"
    image: Any

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("image") is None:
            for alias in ("path", "bytes", "base64"):
                if data.get(alias) is not None:
                    return {**data, "image": data[alias]}
        return data

    @field_validator("image")
    @classmethod
    def _check_image(cls, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            if not len(value):
                raise ValueError("image: empty bytes")
            return bytes(value)
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("image: empty string")
            if value.lower().startswith(_URL_PREFIXES):
                raise ValueError(
                    "image: URLs are not fetched; pass the image as a local path, bytes, "
                    "base64 or a PIL image"
                )
            return value
        if _is_pil_image(value):
            return value
        raise ValueError(
            f"image: expected a path, bytes, a base64 string or a PIL image, got {type(value)!r}"
        )

    @field_serializer("image", when_used="json")
    def _image_to_json(self, value: Any) -> str:
        # JSON carries bytes and PIL images as a data URI; paths stay paths.
        if isinstance(value, str):
            return value
        return image_data_uri(self.image_bytes())

    def image_bytes(self) -> bytes:
        """The encoded image file: read from the path, decoded from base64, or a PIL image
        saved as PNG.

        Raises:
            ValueError: A string that is neither an existing file nor valid base64.
        """
        value = self.image
        if isinstance(value, bytes):
            return value
        if _is_pil_image(value):
            buffer = io.BytesIO()
            value.save(buffer, format="PNG")
            return buffer.getvalue()
        if value.startswith("data:"):
            if _DATA_URI_MARK not in value:
                raise ValueError("image: a data URI must be base64 (data:image/...;base64,...)")
            return _b64decode(value.split(_DATA_URI_MARK, 1)[1])
        if os.path.isfile(value):
            with open(value, "rb") as handle:
                return handle.read()
        if _BASE64.fullmatch(value) and len(value) % 4 == 0:
            return _b64decode(value)
        raise ValueError(f"image: no such file {value[:200]!r}")


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"image: not a file path and not valid base64 ({exc})") from None


def image_data_uri(data: bytes, mime: str = "image/png") -> str:
    """``data:<mime>;base64,<data>``: how images travel inside JSON."""
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


ContentPart = TextPart | ImagePart
"""One part of a multimodal message's content."""


def content_text(content: str | list[ContentPart]) -> str:
    """The text of a message's content, its parts joined (images left out)."""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


def content_images(content: str | list[ContentPart]) -> list[ImagePart]:
    """The images of a message's content, in order."""
    if isinstance(content, str):
        return []
    return [part for part in content if isinstance(part, ImagePart)]


__all__ = [
    "ContentPart",
    "ImagePart",
    "TextPart",
    "content_images",
    "content_text",
    "image_data_uri",
]
