"""TransformersModel: one tenant on one model (a LoRA adapter), the single-user case."""

from __future__ import annotations

from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel


class TransformersModel(MultiLoraTransformersModel):
    """A model with at most one LoRA adapter; every method defaults to it.

    Same API as :class:`MultiLoraTransformersModel`, so code moves between the two unchanged.
    """

    max_adapters = 1
