"""Batch collation: ``InputProcessor`` pads ``InputFeature``s into model-ready tensors.

The class and its name registry live in ``twinkle_client.processor`` and are re-exported here:
one registry, so a processor registered through either package is found by both.
"""

from twinkle_client.processor import (
    InputProcessor,
    get_processor,
    list_processors,
    register_processor,
)

__all__ = ["InputProcessor", "get_processor", "list_processors", "register_processor"]
