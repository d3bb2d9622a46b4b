"""Checkpoint files of the mock backend, written atomically.

A checkpoint is a directory: ``adapter_config.json`` + ``adapter_model.npz`` (weights), and
``trainer_state.json`` (progress, optimizer and schedule settings) + ``optimizer.npz`` when the
optimizer is saved. It is built in a temporary sibling and renamed into place, so a crash never
leaves a half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.npz"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optimizer.npz"


def checkpoint_dir(output_dir: str, name: str) -> str:
    """Join ``output_dir`` and ``name``, refusing names that would escape ``output_dir``."""
    if not name or name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        raise ValueError(f"invalid checkpoint name {name!r}: use a single path component")
    return os.path.join(output_dir, name)


def write_checkpoint(path: str, files: dict[str, dict]) -> str:
    """Write ``{filename: content}`` atomically as the directory ``path``.

    ``.json`` contents are dumped as JSON, ``.npz`` contents are dicts of arrays.

    Returns:
        The absolute checkpoint path.
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        for filename, content in files.items():
            target = os.path.join(tmp, filename)
            if filename.endswith(".json"):
                with open(target, "w", encoding="utf-8") as handle:
                    json.dump(content, handle, indent=2, sort_keys=True)
            else:
                with open(target, "wb") as handle:
                    np.savez(handle, **content)
        _swap_into_place(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _swap_into_place(tmp: str, path: str) -> None:
    # os.replace cannot overwrite a non-empty directory, so an old checkpoint is moved aside
    # first and deleted only once the new one is in place.
    if not os.path.exists(path):
        os.rename(tmp, path)
        return
    trash = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=os.path.dirname(path))
    os.rmdir(trash)
    os.rename(path, trash)
    os.rename(tmp, path)
    shutil.rmtree(trash, ignore_errors=True)


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
