"""Batch collation on the client: ``InputProcessor`` pads ``InputFeature``s (numpy; torch only
for ``return_tensors='pt'``, imported on use). A remote model collates on the server with the
processor named in ``model.set_processor``; this one is for looking at batches locally."""

from twinkle_client.processor._registry import get_processor, list_processors, register_processor
from twinkle_client.processor.base import InputProcessor

__all__ = ["InputProcessor", "get_processor", "list_processors", "register_processor"]
