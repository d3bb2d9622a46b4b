"""The tiny multimodal model: Qwen3.5's image-text architecture at test size, built offline.

``tiny://qwen3.5-vl`` is a random-init ``Qwen3_5ForConditionalGeneration``: the text model of
``tiny://qwen3.5`` (hidden 64, one linear-attention and one full-attention layer) and a small
vision tower (2 blocks, hidden 32, 8-pixel patches, 2x2 merge). The tokenizer is the tiny BPE
with Qwen's vision tokens appended; the image processor is Qwen's (``Qwen2VLImageProcessor``,
which Qwen3.5 uses) with the tiny patch size and a pixel budget that keeps images at 16 to 64
pixels a side (1 to 16 image tokens each), so CPU tests stay fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
#: Appended after the trained vocabulary, so the text tokens keep the ids of ``tiny://qwen3.5``.
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)

PATCH_SIZE = 8
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MIN_PIXELS = 16 * 16
MAX_PIXELS = 64 * 64

# Qwen3-VL / Qwen3.5's chat template, message content as a string or as text and image parts.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' and message.get('reasoning_content') -%}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def vision_config() -> dict[str, Any]:
    """The tiny vision tower's config (``Qwen3_5VisionConfig`` fields)."""
    return dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        in_channels=3,
        patch_size=PATCH_SIZE,
        spatial_merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        # An 8 x 8 grid of learned positions, resampled to each image's patch grid.
        num_position_embeddings=64,
        initializer_range=0.1,
    )


def make_tokenizer(vocab_size: int):
    """The tiny BPE tokenizer with the vision tokens added as special tokens."""
    from ._tokenizer import train_tokenizer

    tokenizer = train_tokenizer(vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_image_processor():
    """Qwen's image processor at the tiny model's patch size and pixel budget."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
    )


def make_config(text_config: dict[str, Any], tokenizer):
    """``Qwen3_5Config`` of the tiny multimodal model; token ids come from ``tokenizer``."""
    from transformers import Qwen3_5Config

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    text = dict(
        text_config,
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(tokenizer.eos_token),
        pad_token_id=tokenizer.convert_tokens_to_ids(tokenizer.pad_token),
    )
    vision = dict(vision_config(), out_hidden_size=text["hidden_size"])
    config = Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
        dtype="float32",
    )
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    return config


def build(spec, target_dir: Path, save) -> Path:
    """Write the tiny multimodal model of ``spec`` (a ``TinySpec``) into ``target_dir``.

    ``save(model, tokenizer, target_dir)`` writes the weights and tokenizer as for the text tiny
    models; the image processor (``preprocessor_config.json``) and the chat template are added.
    """
    import torch
    from transformers import GenerationConfig, Qwen3_5ForConditionalGeneration

    tokenizer = make_tokenizer(spec.vocab_size)
    config = make_config(dict(spec.config), tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3_5ForConditionalGeneration(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=config.text_config.eos_token_id,
        pad_token_id=config.text_config.pad_token_id,
        bos_token_id=None,
    )
    save(model, tokenizer, target_dir)
    make_image_processor().save_pretrained(target_dir)
    (target_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return target_dir
