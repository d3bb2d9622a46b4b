"""A small, real byte-level BPE tokenizer for the tiny models, trained offline on text in the repo.

The layout mirrors Qwen's tokenizer (NFC normalisation, Qwen's pre-tokenisation regex, byte-level
alphabet, ChatML special tokens) so that templates written for real Qwen models render the same way
on the tiny ones; only the vocabulary is small, so CPU tests stay fast.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Order fixes the ids: the special tokens come first (0..6), before the byte alphabet.
SPECIAL_TOKENS = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
)

# Qwen2/Qwen3 pre-tokenisation: contractions, letters, single digits, punctuation runs, newlines.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' and message.get('reasoning_content') -%}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

CORPUS_DIR = Path(__file__).parent / "corpus"
# Text of the dataset shipped with twinkle, if present: the tiny tokenizer then covers it well.
DATASET_DIR = Path(__file__).parent.parent / "dataset" / "data"


def corpus_files() -> list[Path]:
    """Every file the tokenizer is trained on, in a fixed (sorted) order."""
    files = sorted(CORPUS_DIR.glob("*.txt"))
    if DATASET_DIR.is_dir():
        files += sorted(DATASET_DIR.glob("*.jsonl"))
    return files


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key in sorted(value):
            yield from _strings(value[key])
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def iter_corpus_text() -> Iterator[str]:
    """Yield the training text: paragraphs of the corpus files, strings of the dataset rows."""
    for path in corpus_files():
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            for line in text.splitlines():
                if line.strip():
                    yield from _strings(json.loads(line))
        else:
            yield from (p for p in text.split("\n\n") if p.strip())


def _train_backend(vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # The trainer counts words in parallel; one thread keeps the merge order, and so the file
    # bytes, identical from run to run.
    previous = os.environ.get("RAYON_NUM_THREADS")
    os.environ["RAYON_NUM_THREADS"] = "1"
    try:
        tokenizer.train_from_iterator(list(iter_corpus_text()), trainer=trainer)
    finally:
        if previous is None:
            os.environ.pop("RAYON_NUM_THREADS", None)
        else:
            os.environ["RAYON_NUM_THREADS"] = previous
    return tokenizer


def train_tokenizer(vocab_size: int):
    """Train the tiny BPE tokenizer and wrap it as a transformers fast tokenizer.

    Args:
        vocab_size: Target vocabulary size, special tokens included.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ChatML special tokens and chat template.
    """
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_backend(vocab_size),
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t not in (ENDOFTEXT, IM_END)],
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
