"""The transformers backend: real models from transformers, adapters from twinkle.model.lora."""

from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
from twinkle.model.transformers.single import TransformersModel

__all__ = ["MultiLoraTransformersModel", "TransformersModel"]
