"""Templates for the Qwen3 family: ChatML with ``<think>`` blocks."""

from __future__ import annotations

from typing import Any

from twinkle.template._registry import register_template
from twinkle.template.base import Template


@register_template
class Qwen3Template(Template):
    """Qwen3 chat format.

    Rendering is the base ChatML with ``<think>`` blocks. ``enable_thinking=False`` is Qwen3's
    switch for answering without thinking: the generation prompt then carries an empty think
    block, ``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``, which the model continues.

    Args:
        model_id: See ``Template``.
        max_length: See ``Template``.
        truncation_strategy: See ``Template``.
        tokenizer: See ``Template``.
        enable_thinking: Whether generation may start with a thinking block.
    """

    def __init__(
        self,
        model_id: str | None = None,
        max_length: int | None = None,
        truncation_strategy: str = "raise",
        tokenizer: Any = None,
        enable_thinking: bool = True,
    ) -> None:
        super().__init__(model_id, max_length, truncation_strategy, tokenizer)
        self.enable_thinking = enable_thinking

    def _generation_prompt(self) -> str:
        prompt = super()._generation_prompt()
        return prompt if self.enable_thinking else f"{prompt}<think>\n\n</think>\n\n"


@register_template
class Qwen3_5Template(Qwen3Template):
    """Qwen3.5 chat format (same text layout as Qwen3; kept as its own name for the seeds)."""
