"""Training data types, shared with the client: ``Message`` (text or text + image parts),
``Trajectory``, ``InputFeature``.

They are defined in ``twinkle_client.data_format`` (no torch) and re-exported here, so local and
remote code exchange the very same classes.
"""

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

__all__ = [
    "IGNORE_INDEX",
    "ContentPart",
    "ImagePart",
    "InputFeature",
    "Message",
    "Role",
    "TextPart",
    "Trajectory",
]
