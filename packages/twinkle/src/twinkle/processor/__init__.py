"""Batch collation: ``InputProcessor`` pads ``InputFeature``s into model-ready tensors."""

from twinkle.processor._registry import get_processor, list_processors, register_processor
from twinkle.processor.base import InputProcessor

__all__ = ["InputProcessor", "get_processor", "list_processors", "register_processor"]
