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

import contextlib
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


#: A staging directory untouched this long belongs to a save that was killed, not a slow one.
PARTIAL_SAVE_AGE_S = 3600.0
#: The two renames of a replacement follow each other at once; a copy moved aside longer ago
#: than this belongs to a save that was killed between them.
RENAME_WINDOW_S = 10.0


@contextmanager
def atomic_directory(final: Path):
    """Yield a temporary directory that replaces ``final`` only if the block succeeds.

    A process killed inside the block leaves its staging directory (``.<name>.tmp-*``) and
    ``final`` as it was; one killed between the two renames of a replacement leaves the previous
    checkpoint as ``.<name>.old-*`` and no ``final``: :func:`recover_interrupted` puts it back
    and :func:`sweep_partial_saves` clears both kinds of leftover."""
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


def recover_interrupted(final: Path, now: float | None = None) -> bool:
    """Put back the previous checkpoint that a save killed between its two renames left as
    ``.<name>.old-*`` (``final`` missing); whether it did. A copy moved aside within the last
    :data:`RENAME_WINDOW_S` is left alone: its save may be about to rename the new one in."""
    import time

    now = time.time() if now is None else now
    if final.exists():
        return False
    olds = []
    for old in final.parent.glob(f".{final.name}.old-*"):
        with contextlib.suppress(OSError):  # gone meanwhile
            olds.append((old.stat().st_ctime, old))  # a rename sets the ctime
    if not olds or now - max(olds)[0] < RENAME_WINDOW_S:
        return False
    olds.sort()
    os.rename(olds[-1][1], final)
    for _, extra in olds[:-1]:
        shutil.rmtree(extra, ignore_errors=True)
    return True


def sweep_partial_saves(root: Path, now: float | None = None) -> list[Path]:
    """Clear what killed saves left under ``root``: staging directories untouched for
    :data:`PARTIAL_SAVE_AGE_S`, replaced checkpoints whose replacement is in place, and put back
    a previous checkpoint whose replacement never arrived. Returns the paths removed or put
    back."""
    import time

    now = time.time() if now is None else now
    touched: list[Path] = []
    for folder, dirs, _ in os.walk(root):
        for name in [d for d in dirs if d.startswith(".")]:
            dirs.remove(name)  # never walk into a hidden directory: no checkpoint lives there
            path = Path(folder) / name
            visible, _, kind = name[1:].rpartition(".")
            final = Path(folder) / visible
            try:
                if kind.startswith("tmp-") and now - path.stat().st_mtime >= PARTIAL_SAVE_AGE_S:
                    shutil.rmtree(path, ignore_errors=True)
                    touched.append(path)
                elif kind.startswith("old-") and final.exists():
                    shutil.rmtree(path, ignore_errors=True)
                    touched.append(path)
                elif kind.startswith("old-") and recover_interrupted(final, now):
                    touched.append(final)
            except OSError:  # gone meanwhile
                continue
    return touched


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
    if not directory.exists():
        recover_interrupted(directory)  # a save killed between its renames
    if (
        not (directory / ADAPTER_WEIGHTS).is_file()
        and not (directory / "model.safetensors").is_file()
    ):
        raise FileNotFoundError(f"{directory} is not a checkpoint: no {ADAPTER_WEIGHTS} in it")
    return directory
