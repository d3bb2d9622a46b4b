"""Wire types for training data: chat messages, trajectories and encoded input features.

These types live in the client distribution (numpy and pydantic only, no torch) so a laptop can
build and send training data; ``twinkle.data_format`` re-exports them unchanged.
"""

from twinkle_client.data_format._content import ContentPart, ImagePart, TextPart
from twinkle_client.data_format._input_feature import IGNORE_INDEX, InputFeature
from twinkle_client.data_format._message import Message, Role, Trajectory

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
