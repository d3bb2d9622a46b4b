"""Chat messages and trajectories (a conversation plus per-sample metadata)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]


class Message(BaseModel):
    """One chat turn.

    Attributes:
        role: Who speaks: ``system``, ``user``, ``assistant`` or ``tool``.
        content: The visible text of the turn.
        reasoning_content: The assistant's thinking, rendered inside ``<think>...</think>`` by
            templates that support it; ``None`` when there is none.
    """

    # Datasets often carry extra per-message keys (``name``, ``loss``...); tolerating them keeps
    # rows from public datasets usable without a custom preprocessor.
    model_config = ConfigDict(extra="ignore")

    role: Role
    content: str
    reasoning_content: str | None = None


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
