"""Checkpoint files of the mock backend, written atomically.

A checkpoint is a directory: ``adapter_config.json`` + ``adapter_model.npz`` (weights), and
``trainer_state.json`` (progress, optimizer and schedule settings) + ``optimizer.npz`` when the
optimizer is saved. It is built in a temporary sibling and renamed into place, so a crash never
leaves a half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from twinkle.model.checkpoint import atomic_directory, validate_checkpoint_name

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.npz"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optimizer.npz"


def checkpoint_dir(output_dir: str, name: str) -> str:
    """Join ``output_dir`` and ``name``, refusing names that would escape ``output_dir``."""
    return os.path.join(output_dir, validate_checkpoint_name(name))


def write_checkpoint(path: str, files: dict[str, dict]) -> str:
    """Write ``{filename: content}`` atomically as the directory ``path``.

    ``.json`` contents are dumped as JSON, ``.npz`` contents are dicts of arrays.

    Returns:
        The absolute checkpoint path.
    """
    path = os.path.abspath(path)
    with atomic_directory(Path(path)) as tmp:
        for filename, content in files.items():
            if filename.endswith(".json"):
                (tmp / filename).write_text(
                    json.dumps(content, indent=2, sort_keys=True), encoding="utf-8"
                )
            else:
                with open(tmp / filename, "wb") as handle:
                    np.savez(handle, **content)
    return path


def read_json(path: str, filename: str) -> dict:
    """Read one JSON file of a checkpoint."""
    with open(os.path.join(path, filename), encoding="utf-8") as handle:
        return json.load(handle)


def read_arrays(path: str, filename: str) -> dict[str, np.ndarray]:
    """Read one ``.npz`` file of a checkpoint into a plain dict."""
    with np.load(os.path.join(path, filename)) as data:
        return {key: data[key].copy() for key in data.files}


def has_file(path: str, filename: str) -> bool:
    """Whether the checkpoint holds ``filename``."""
    return os.path.isfile(os.path.join(path, filename))
