"""Training data types, shared with the client: ``Message`` (text or text + image parts),
``Trajectory``, ``InputFeature``, and the sampler's ``SamplingParams``.

They are defined in ``twinkle_client`` (no torch) and re-exported here, so local and remote
code exchange the very same classes.
"""

from typing import Any

import twinkle_client.data_format as _client
from twinkle_client.data_format import (
    IGNORE_INDEX,
    ContentPart,
    ImagePart,
    InputFeature,
    Message,
    Role,
    TextPart,
    Trajectory,
)


def __getattr__(name: str) -> Any:
    # SamplingParams & co. resolve lazily in the client package (they live in its sampler).
    if name in _client._SAMPLER_TYPES:
        return getattr(_client, name)
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
