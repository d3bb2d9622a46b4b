"""What the Tinker routes look up about base models and checkpoints: tokenizer directory,
vocabulary size, the LoRA config and base model behind a checkpoint path."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from twinkle.server.tinker.convert import to_twinkle_path

logger = logging.getLogger("twinkle.server.gateway.tinker")


@dataclass(frozen=True)
class ModelFacts:
    """Local facts about a base model; ``None`` where they could not be read offline."""

    tokenizer_id: str | None
    vocab_size: int | None
    arch: str | None
    moe: bool = False  # a mixture-of-experts model (its experts take LoRA with train_mlp)


@lru_cache(maxsize=64)
def model_facts(base_model: str) -> ModelFacts:
    """Tokenizer directory (absolute, so ``AutoTokenizer`` resolves it offline), vocab size, arch."""
    try:
        from twinkle.hub import resolve_model_dir

        directory = Path(resolve_model_dir(base_model)).resolve()
    except Exception as exc:  # noqa: BLE001 - an unresolvable model still trains, just without these facts
        logger.warning(
            "cannot resolve %s locally (%s); get_info reports no tokenizer directory",
            base_model,
            exc,
        )
        return ModelFacts(None, None, None)
    vocab, arch, moe = None, None, False
    config_path = directory / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        text = config.get("text_config") or {}
        vocab = config.get("vocab_size") or text.get("vocab_size")
        arch = (config.get("architectures") or [config.get("model_type")])[0]
        moe = bool(
            config.get("num_experts") or config.get("num_local_experts") or text.get("num_experts")
        )
    return ModelFacts(str(directory), int(vocab) if vocab else None, arch, moe)


@dataclass(frozen=True)
class CheckpointFacts:
    """A checkpoint the caller may load: its record, base model and LoRA config."""

    path: str  # twinkle://...
    owner: str
    run_id: str
    kind: str
    local_dir: str
    base_model: str
    lora: dict[str, Any]


def checkpoint_facts(state: Any, owner: str, path: str) -> CheckpointFacts:
    """Resolve a ``tinker://``/``twinkle://`` path the caller owns (or that is public)."""
    record = state.resolve_checkpoint_path(owner, to_twinkle_path(path), allow_public=True)
    run = state.get_run(record.owner, record.training_run_id)
    config_path = Path(record.local_dir) / "adapter_config.json"
    lora: dict[str, Any] = dict(run.lora_config or {})
    if config_path.is_file():
        saved = json.loads(config_path.read_text(encoding="utf-8"))
        lora = {
            k: saved[k]
            for k in ("r", "lora_alpha", "lora_dropout", "use_rslora", "target_modules")
            if k in saved
        }
    if "r" not in lora:
        lora["r"] = run.lora_rank
    return CheckpointFacts(
        record.path,
        record.owner,
        record.training_run_id,
        record.kind,
        record.local_dir,
        run.base_model,
        lora,
    )
