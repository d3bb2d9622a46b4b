"""Chat messages and trajectories (a conversation plus per-sample metadata).

Both are pydantic models that also read like the plain dicts many scripts pass around:
``message['role']``, ``message.get('content', '')``, ``trajectory.get('user_data', [])`` and
``{**trajectory}`` work as on a dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from twinkle_client.data_format._content import (
    ImagePart,
    TextPart,
    content_images,
    content_text,
)

Role = Literal["system", "user", "assistant", "tool"]

IMAGE_PLACEHOLDER = "<image>"
"""Marks where an image given with ``Message(images=[...])`` sits in a string content."""


class _DictAccess:
    """Read access by key, as on a dict: ``obj['field']``, ``obj.get('field')``, ``'field' in
    obj``, ``obj.keys()`` (so ``{**obj}`` and ``dict(obj)`` give the fields)."""

    # Read-only views readable by key but not listed by ``keys()``: re-building an object from
    # ``{**obj}`` must not pass them twice.
    _views: ClassVar[tuple[str, ...]] = ()

    def keys(self) -> list[str]:
        """The field names."""
        return list(type(self).model_fields)  # type: ignore[attr-defined]

    def _readable(self, key: object) -> bool:
        return key in type(self).model_fields or key in type(self)._views  # type: ignore[attr-defined]

    def __getitem__(self, key: str) -> Any:
        if not self._readable(key):
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return self._readable(key)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when there is no such field."""
        return getattr(self, key) if self._readable(key) else default


def _place_images(content: Any, images: Sequence[Any]) -> list[dict[str, Any]]:
    """``content`` as a list of parts with ``images`` in it: each ``<image>`` in the text takes
    the next image; images without a placeholder go first, in order.

    Raises:
        ValueError: More ``<image>`` placeholders than images.
    """
    if isinstance(content, str):
        pieces = content.split(IMAGE_PLACEHOLDER)
        slots = len(pieces) - 1
        if slots > len(images):
            raise ValueError(
                f"content has {slots} {IMAGE_PLACEHOLDER} placeholder(s) but only "
                f"{len(images)} image(s) were given"
            )
        lead = len(images) - slots
        parts: list[dict[str, Any]] = [{"type": "image", "image": i} for i in images[:lead]]
        for position, piece in enumerate(pieces):
            if position:
                parts.append({"type": "image", "image": images[lead + position - 1]})
            if piece:
                parts.append({"type": "text", "text": piece})
        return parts
    parts = [{"type": "image", "image": image} for image in images]
    return parts + list(content or [])


class Message(_DictAccess, BaseModel):
    """One chat turn.

    Attributes:
        role: Who speaks: ``system``, ``user``, ``assistant`` or ``tool``.
        content: The turn as a string, or as a list of parts in reading order:
            ``{"type": "text", "text": ...}`` and ``{"type": "image", "image": ...}`` (a path,
            bytes, base64 or a PIL image; see ``ImagePart``). Only non-assistant turns carry
            images: the model reads images, it is never trained to produce them.
        reasoning_content: The assistant's thinking, rendered inside ``<think>...</think>`` by
            templates that support it; ``None`` when there is none.
        tool_calls: The tool calls an assistant turn makes (OpenAI-style dicts).
        tool_call_id: For a ``tool`` turn, the id of the call it answers.
        name: Optional speaker or tool name.

    ``Message(role='user', content='<image>What is this?', images=[img])`` is accepted too: the
    images become image parts of ``content``, each at its ``<image>`` placeholder (images
    without one go first), so nothing given is lost on the way to the template.

    Raises:
        pydantic.ValidationError: An unknown role, an image in an assistant turn, or more
            ``<image>`` placeholders than images.
    """

    # Datasets often carry extra per-message keys (``loss``, ``weight``...); tolerating them keeps
    # rows from public datasets usable without a custom preprocessor.
    model_config = ConfigDict(extra="ignore")
    _views: ClassVar[tuple[str, ...]] = ("images", "text")

    role: Role
    content: str | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]] = ""
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _images_into_content(cls, data: Any) -> Any:
        if isinstance(data, dict) and "images" in data:
            data = dict(data)
            images = data.pop("images") or []
            if images:
                data["content"] = _place_images(data.get("content", ""), list(images))
        return data

    @model_validator(mode="after")
    def _no_assistant_images(self) -> Message:
        if self.role == "assistant" and self.images:
            raise ValueError(
                "content: an assistant message cannot hold images (images are model inputs; "
                "put them in a user or system message)"
            )
        return self

    @property
    def text(self) -> str:
        """The content's text (the parts' text joined, images left out)."""
        return content_text(self.content)

    @property
    def images(self) -> list[ImagePart]:
        """The content's images, in order (empty for a string content)."""
        return content_images(self.content)


class Trajectory(_DictAccess, BaseModel):
    """A conversation and the metadata that travels with it.

    Attributes:
        messages: The turns, in order (may be empty: a preprocessor's way to mark a row for a
            later ``filter``).
        tools: Tool definitions offered to the model (OpenAI-style dicts).
        user_data: Per-sample data for rewards and metrics that is never rendered, e.g.
            ``[('ground_truth', '42')]`` or ``{'answer': 42}``.
        extra: Free-form per-sample data that is not rendered (the older name of the same idea;
            both are kept as given).
    """

    model_config = ConfigDict(extra="ignore")

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    user_data: list[Any] | dict[str, Any] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def coerce(cls, value: Trajectory | dict[str, Any]) -> Trajectory:
        """Return ``value`` as a ``Trajectory``, validating a plain ``{'messages': [...]}`` dict.

        Raises:
            TypeError: If ``value`` is neither a ``Trajectory`` nor a dict.
            pydantic.ValidationError: If the dict does not describe a valid trajectory.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls.model_validate(value)
        raise TypeError(f"expected a Trajectory or a dict with 'messages', got {type(value)!r}")

    @property
    def images(self) -> list[ImagePart]:
        """Every image of the conversation, in reading order."""
        return [image for message in self.messages for image in message.images]
