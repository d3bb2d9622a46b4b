"""The tiny tokenizer: a real byte-level BPE with Qwen's special tokens and ChatML template."""

import pytest

from twinkle.hub import load_tokenizer

pytestmark = pytest.mark.unit

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
]


@pytest.fixture(scope="module", params=["tiny://qwen3", "tiny://qwen3.5"])
def tokenizer(request, hub_cache):
    return load_tokenizer(request.param)


def test_vocab_and_special_ids(tokenizer):
    assert len(tokenizer) == 4096
    assert tokenizer.convert_tokens_to_ids(SPECIALS) == list(range(7))
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (2, 0)


@pytest.mark.parametrize(
    "text",
    [
        "Training a language model starts with data.",
        "  Leading spaces, tabs\tand\nnew lines!\n\n",
        "早上好，今天天气很好。",
        "mixed 中文 and English, numbers 12345 and emoji 🙂",
    ],
)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_bpe_merges_common_words(tokenizer):
    # A trained vocabulary, not bytes: frequent words are single tokens.
    assert len(tokenizer.tokenize("the model")) == 2


def test_special_tokens_are_never_split(tokenizer):
    text = "".join(SPECIALS) + "<|im_start|>user\nhi<|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[:7] == list(range(7))
    assert ids[7] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids) == text


def test_chat_template(tokenizer):
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nAdd them.\n</think>\n\n4<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = tokenizer.apply_chat_template([{"role": "assistant", "content": "ok"}], tokenize=False)
    assert plain == "<|im_start|>assistant\nok<|im_end|>\n"


def test_load_tokenizer_is_cached(hub_cache):
    assert load_tokenizer("tiny://qwen3") is load_tokenizer("tiny/qwen3")
