"""Which transformers auto class loads a base model: image-text models keep their vision tower."""

from __future__ import annotations

import os


def auto_model_class(model_dir: str | os.PathLike[str], trust_remote_code: bool):
    """``AutoModelForImageTextToText`` for a model with a vision tower (Qwen3.5 and the tiny
    ``qwen3.5-vl``: text and image tenants share it), else ``AutoModelForCausalLM``.

    ``AutoModelForCausalLM`` would load only the language model of Qwen3.5 (transformers maps
    ``qwen3_5`` to the text-only ``Qwen3_5ForCausalLM``), dropping the vision tower.
    """
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if getattr(config, "vision_config", None) is not None:
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM
