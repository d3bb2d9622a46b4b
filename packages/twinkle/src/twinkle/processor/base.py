"""``InputProcessor``: pads a list of ``InputFeature``s into one batch of tensors.

Defined in ``twinkle_client.processor.base`` (numpy; torch is imported only when a batch is
converted with ``return_tensors='pt'``) and re-exported here, so local and remote code collate
with the very same class.
"""

from twinkle_client.processor.base import (
    IGNORE_INDEX,
    PADDING_SIDES,
    RETURN_TENSORS,
    InputProcessor,
)

__all__ = ["IGNORE_INDEX", "PADDING_SIDES", "RETURN_TENSORS", "InputProcessor"]
