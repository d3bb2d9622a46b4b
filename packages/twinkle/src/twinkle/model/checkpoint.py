"""Checkpoint directories: PEFT adapter files plus training state, written atomically.

Layout of ``<output_dir>/<name>/``::

    adapter_config.json          PEFT config (peft.PeftModel.from_pretrained and vLLM load it)
    adapter_model.safetensors    PEFT-keyed LoRA weights
    trainer_state.json           step, consumed samples, train configs
    optimizer.pt scheduler.pt rng_state.pt   only with save_optimizer=True
    pending_grads.pt             ... and when saved mid gradient-accumulation window

Everything is written to a hidden temporary sibling and renamed into place, so a crash mid-save
never leaves a directory that looks like a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from twinkle.errors import InvalidArgumentError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optimizer.pt"
SCHEDULER_STATE = "scheduler.pt"
RNG_STATE = "rng_state.pt"
# Gradients accumulated inside an unfinished accumulation window, so a resume continues exactly.
PENDING_GRADS = "pending_grads.pt"


CHECKPOINT_NAME_MAX_LENGTH = 128
_CHECKPOINT_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def validate_checkpoint_name(name: str) -> str:
    """Return ``name`` if it is one safe path component (the one rule for local and served
    checkpoints).

    Allowed: ASCII letters, digits, ``-``, ``_`` and ``.``; at most 128 characters; no leading dot
    and no ``..`` anywhere. This excludes separators, absolute paths, hidden files and look-alike
    Unicode characters such as the fullwidth slash.

    Raises:
        InvalidArgumentError: On anything else.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("checkpoint name must be a non-empty string")
    if len(name) > CHECKPOINT_NAME_MAX_LENGTH:
        raise InvalidArgumentError(
            f"checkpoint name longer than {CHECKPOINT_NAME_MAX_LENGTH} characters"
        )
    if not _CHECKPOINT_NAME.fullmatch(name) or name.startswith(".") or ".." in name:
        raise InvalidArgumentError(
            f"invalid checkpoint name {name!r}: use letters, digits, '-', '_' and '.', "
            "no leading dot, no '..', no path separators"
        )
    return name


@contextmanager
def atomic_directory(final: Path):
    """Yield a temporary directory that replaces ``final`` only if the block succeeds."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        for path in tmp.iterdir():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        if final.exists():
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def capture_rng_state() -> dict[str, Any]:
    import torch

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def require_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint directory, or a clear error when it is not one.

    Raises:
        FileNotFoundError: When the directory or its adapter files are missing.
    """
    directory = Path(path)
    if (
        not (directory / ADAPTER_WEIGHTS).is_file()
        and not (directory / "model.safetensors").is_file()
    ):
        raise FileNotFoundError(f"{directory} is not a checkpoint: no {ADAPTER_WEIGHTS} in it")
    return directory
