"""A local PEFT adapter directory as the body of the server's ``upload_adapter`` operation."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
UPLOAD_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
SERVER_SCHEMES = ("twinkle://", "tinker://")


def is_server_path(path: str | os.PathLike) -> bool:
    """A ``twinkle://`` / ``tinker://`` checkpoint path names the server's storage; any other
    path is a directory on this machine."""
    return str(path).startswith(SERVER_SCHEMES)


def adapter_directory(path: str | os.PathLike) -> Path:
    """``path`` as a local adapter directory holding both adapter files.

    Raises:
        FileNotFoundError: Not a directory, or one of the two files is missing.
    """
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(
            f"{path}: no such local directory (a checkpoint on the server is a twinkle:// path)"
        )
    for name in UPLOAD_FILES:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory}: no {name} (not a PEFT adapter directory)")
    return directory


def upload_body(directory: Path, name: str | None) -> dict[str, Any]:
    """The ``upload_adapter`` request: the checkpoint name (default: the directory's name) and
    the two adapter files, base64. Other files in the directory are not sent."""
    files = {
        f: base64.b64encode((directory / f).read_bytes()).decode("ascii") for f in UPLOAD_FILES
    }
    return {"name": name or directory.resolve().name, "files": files}


def read_adapter_config(directory: str | os.PathLike) -> dict[str, Any]:
    """A local adapter directory's ``adapter_config.json`` as a dict."""
    return json.loads((Path(directory).expanduser() / ADAPTER_CONFIG).read_text())
