"""Merge a LoRA adapter into its base model's weights: a standard Hugging Face model directory.

The result is what ``transformers.AutoModelForCausalLM.from_pretrained`` and vLLM load with no
adapter support: ``config.json``, ``generation_config.json`` (when the base has one), the base's
tokenizer and chat-template files, and the merged weights as safetensors, sharded with a
``model.safetensors.index.json`` when they exceed ``max_shard_size``.

The adapter is any PEFT LoRA directory (``adapter_config.json`` + ``adapter_model.safetensors``),
which is what ``save`` writes for every tenant of a multi-LoRA model (see docs/checkpoints.md);
training state beside it (optimizer, RNG, ...) is ignored. The merge itself is PEFT's
(``merge_and_unload(safe_merge=True)``), so everything PEFT loads merges the same way: rsLoRA
scaling, per-module ranks, expert parameters (``target_parameters``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.errors import InvalidArgumentError, PathNotFoundError
from twinkle.model import checkpoint as ckpt

#: transformers' own default is 50GB; 5GB shards download and upload in pieces a retry can
#: afford to lose, and stay under the Hugging Face Hub's per-file recommendation.
DEFAULT_MAX_SHARD_SIZE = "5GB"
#: Files of the base model directory copied beside the merged weights when present.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)


@dataclass(frozen=True)
class MergedModel:
    """A merged model directory.

    Attributes:
        directory: Where it is.
        files: Its files, by name, sorted.
        size_bytes: The bytes they hold together.
        base_model: The base model directory it was merged from.
    """

    directory: Path
    files: tuple[str, ...]
    size_bytes: int
    base_model: str


def read_adapter_config(adapter_dir: str | os.PathLike) -> dict[str, Any]:
    """The PEFT config of a LoRA adapter directory, checked to be one.

    Raises:
        PathNotFoundError: The directory or one of its two adapter files is missing.
        InvalidArgumentError: The files are encrypted, or the adapter is not a LoRA adapter.
    """
    directory = Path(adapter_dir)
    if not directory.is_dir():
        raise PathNotFoundError(f"adapter directory {str(directory)!r} does not exist")
    if (directory / (ckpt.ADAPTER_WEIGHTS + ".age")).is_file():
        raise InvalidArgumentError(
            f"{str(directory)!r} holds age-encrypted adapter files: decrypt them first"
        )
    missing = [
        name
        for name in (ckpt.ADAPTER_CONFIG, ckpt.ADAPTER_WEIGHTS)
        if not (directory / name).is_file()
    ]
    if missing:
        raise PathNotFoundError(
            f"{str(directory)!r} is not a PEFT adapter directory: {', '.join(missing)} missing"
        )
    config = ckpt.read_json(directory / ckpt.ADAPTER_CONFIG)
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidArgumentError(
            f"only LoRA adapters merge; {str(directory)!r} is {config.get('peft_type')!r}"
        )
    return config


def base_model_size(model_dir: str | os.PathLike) -> int:
    """The bytes of a model directory's weights (``*.safetensors`` and ``*.bin``): about what a
    merged copy of it takes on disk."""
    return sum(
        p.stat().st_size
        for pattern in ("*.safetensors", "*.bin")
        for p in Path(model_dir).glob(pattern)
        if p.is_file()
    )


def merge_adapter(
    base_model_id_or_dir: str | os.PathLike | None,
    adapter_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    *,
    dtype: Any = "auto",
    overwrite: bool = False,
) -> MergedModel:
    """Write base model + adapter, merged, as a Hugging Face model directory ``out_dir``.

    The directory appears whole or not at all: it is written into a hidden sibling and renamed
    into place once complete.

    Args:
        base_model_id_or_dir: The base model: ``tiny://...``, ``ms://...``, ``hf://...`` or a
            local directory (see :func:`twinkle.hub.resolve_model_dir`); ``None`` takes the
            adapter config's ``base_model_name_or_path``.
        adapter_dir: A PEFT LoRA adapter directory (a Twinkle checkpoint is one).
        out_dir: The directory to write. It must not exist, or be empty, unless ``overwrite``.
        max_shard_size: The largest safetensors file (``"5GB"``, ``"200MB"`` or bytes); larger
            weights are sharded and indexed by ``model.safetensors.index.json``.
        dtype: The dtype to load and save the base in (``"auto"``: its config's).
        overwrite: Replace an existing non-empty ``out_dir``.

    Returns:
        The :class:`MergedModel`.

    Raises:
        PathNotFoundError: ``adapter_dir`` is not an adapter directory.
        InvalidArgumentError: The adapter is not LoRA, is encrypted, holds non-finite weights, or
            ``out_dir`` is not empty (without ``overwrite``); the base is unknown.
        ValueError: The adapter does not fit the base model (PEFT's message).
    """
    config = read_adapter_config(adapter_dir)
    base = base_model_id_or_dir or config.get("base_model_name_or_path")
    if not base:
        raise InvalidArgumentError(
            "no base model: pass base_model_id_or_dir (the adapter config names none)"
        )
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise InvalidArgumentError(
            f"out_dir {str(out)!r} exists and is not empty: choose a new directory or pass "
            "overwrite=True"
        )
    from twinkle.hub import resolve_model_dir

    model_dir = resolve_model_dir(str(base))
    with ckpt.atomic_directory(out) as staging:
        _merge_into(model_dir, Path(adapter_dir), staging, max_shard_size, dtype)
    files = tuple(sorted(p.name for p in out.iterdir() if p.is_file()))
    size = sum((out / name).stat().st_size for name in files)
    return MergedModel(out, files, size, str(model_dir))


def _merge_into(
    model_dir: Path, adapter_dir: Path, staging: Path, max_shard_size: int | str, dtype: Any
) -> None:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    from twinkle.hub import remote_code_guard
    from twinkle.model.engine._checkpoints import check_finite_weights
    from twinkle.model.transformers._auto import auto_model_class

    check_finite_weights(load_file(str(adapter_dir / ckpt.ADAPTER_WEIGHTS)))
    with remote_code_guard(model_dir) as trust, torch.no_grad():
        model = auto_model_class(model_dir, trust).from_pretrained(
            model_dir, dtype=dtype, trust_remote_code=trust
        )
        peft_model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
        merged = peft_model.merge_and_unload(safe_merge=True)
        merged.save_pretrained(staging, max_shard_size=max_shard_size)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file() and not (staging / name).exists():
            shutil.copyfile(model_dir / name, staging / name)


__all__ = [
    "DEFAULT_MAX_SHARD_SIZE",
    "MergedModel",
    "base_model_size",
    "merge_adapter",
    "read_adapter_config",
]
