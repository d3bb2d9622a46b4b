"""Chat messages and trajectories (a conversation plus per-sample metadata)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from twinkle_client.data_format._content import (
    ImagePart,
    TextPart,
    content_images,
    content_text,
)

Role = Literal["system", "user", "assistant", "tool"]


class Message(BaseModel):
    """One chat turn.

    Attributes:
        role: Who speaks: ``system``, ``user``, ``assistant`` or ``tool``.
        content: The turn as a string, or as a list of parts in reading order:
            ``{"type": "text", "text": ...}`` and ``{"type": "image", "image": ...}`` (a path,
            bytes, base64 or a PIL image; see ``ImagePart``). Only non-assistant turns carry
            images: the model reads images, it is never trained to produce them.
        reasoning_content: The assistant's thinking, rendered inside ``<think>...</think>`` by
            templates that support it; ``None`` when there is none.
    """

    # Datasets often carry extra per-message keys (``name``, ``loss``...); tolerating them keeps
    # rows from public datasets usable without a custom preprocessor.
    model_config = ConfigDict(extra="ignore")

    role: Role
    content: str | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]]
    reasoning_content: str | None = None

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


class Trajectory(BaseModel):
    """A conversation and the metadata that travels with it.

    Attributes:
        messages: The turns, in order.
        extra: Free-form per-sample data that is not rendered, e.g. the ground-truth answer an RL
            reward function compares against.
    """

    model_config = ConfigDict(extra="ignore")

    messages: list[Message]
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
