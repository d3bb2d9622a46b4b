"""Wire types for training data: chat messages, trajectories and encoded input features.

These types live in the client distribution (numpy and pydantic only, no torch) so a laptop can
build and send training data; ``twinkle.data_format`` re-exports them unchanged.

``SamplingParams``, ``SampledSequence`` and ``SampleResponse`` are the sampler's own types
(``twinkle_client.sampler.types``), reachable here too under the names upstream scripts import:
the same classes, so a value built from either import is accepted by every sampler.
"""

from typing import Any

from twinkle_client.data_format._content import ContentPart, ImagePart, TextPart
from twinkle_client.data_format._input_feature import IGNORE_INDEX, InputFeature
from twinkle_client.data_format._message import Message, Role, Trajectory

# Resolved on first use: the sampler's types import this package, so a top-level import here
# would be circular.
_SAMPLER_TYPES = ("SampleResponse", "SampledSequence", "SamplingParams")


def __getattr__(name: str) -> Any:
    if name in _SAMPLER_TYPES:
        from twinkle_client.sampler import types

        return getattr(types, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "IGNORE_INDEX",
    "ContentPart",
    "ImagePart",
    "InputFeature",
    "Message",
    "Role",
    "SampleResponse",
    "SampledSequence",
    "SamplingParams",
    "TextPart",
    "Trajectory",
]
