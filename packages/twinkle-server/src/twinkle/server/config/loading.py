"""Read a server config from YAML (or a dict), and write it back normalised."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from twinkle.server.config._errors import ConfigError
from twinkle.server.config.server import ServerConfig
from twinkle.server.env import TWINKLE_SERVER_CONFIG

CONFIG_ENV = TWINKLE_SERVER_CONFIG.name
MASK = "***"


def parse_config(data: Any, source: str | None = None) -> ServerConfig:
    """Validate a mapping (parsed YAML/JSON) into a ``ServerConfig``.

    Raises:
        ConfigError: listing every problem as ``<dotted.path>: <message>``.
    """
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise ConfigError([f"<root>: expected a mapping of config fields, got {kind}"], source)
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError.from_validation_error(error, source) from None


def config_path(path: str | os.PathLike | None = None) -> Path:
    """``path``, else ``$TWINKLE_SERVER_CONFIG``.

    Raises:
        ConfigError: neither is given.
    """
    chosen = path if path is not None else TWINKLE_SERVER_CONFIG.get()
    if not chosen:
        raise ConfigError([f"<root>: no config file: pass a path or set {CONFIG_ENV}"])
    return Path(chosen).expanduser()


def apply_overrides(data: Any, overrides: list[str], source: str | None = None) -> Any:
    """Set ``dotted.path=value`` items in parsed YAML; ``applications.<name>`` picks by name.

    The value is read as YAML (``8000`` an int, ``true`` a bool, ``torch`` a string). Only an
    existing mapping is descended into, so a typo names the missing key instead of adding it
    silently (a new leaf key is allowed: the schema then judges it).

    Raises:
        ConfigError: a malformed item, or a path that does not exist.
    """
    for item in overrides:
        dotted, sep, raw = item.partition("=")
        if not sep or not dotted.strip():
            raise ConfigError([f"--set {item!r}: expected <dotted.path>=<value>"], source)
        parts = dotted.strip().split(".")
        node, walked, i = data, [], 0
        while i < len(parts) - 1:
            if isinstance(node, list):
                # Application names may hold dots (sampler-Qwen3.5-4B): take the longest match.
                names = [a.get("name") for a in node if isinstance(a, dict)]
                j = next((j for j in range(len(parts) - 1, i, -1)
                          if ".".join(parts[i:j]) in names), None)  # fmt: skip
                if j is None:
                    raise ConfigError(
                        [f"--set {dotted}: no entry named '{parts[i]}...' in "
                         f"{'.'.join(walked)} (names: {', '.join(map(str, names))})"], source)  # fmt: skip
                key = ".".join(parts[i:j])
                node = node[names.index(key)]
                i = j
            elif isinstance(node, dict) and isinstance(node.get(parts[i]), (dict, list)):
                key = parts[i]
                node = node[key]
                i += 1
            else:
                raise ConfigError(
                    [f"--set {dotted}: '{'.'.join(walked + [parts[i]])}' is not a section"], source
                )
            walked.append(key)
        leaf = parts[-1]
        if not isinstance(node, dict):
            raise ConfigError([f"--set {dotted}: '{'.'.join(walked)}' is not a mapping"], source)
        node[leaf] = yaml.safe_load(raw)
    return data


def load_config(
    path: str | os.PathLike | None = None, overrides: list[str] | None = None
) -> ServerConfig:
    """Load and validate the server YAML at ``path`` (default: ``$TWINKLE_SERVER_CONFIG``).

    ``overrides`` are ``dotted.path=value`` items applied before validation (the CLI's ``--set``),
    so a config file is used unmodified on a machine that needs one field changed.

    Raises:
        ConfigError: no path, unreadable file, bad YAML, or invalid fields (each problem named
            by its dotted path; the message names the file).
    """
    resolved = config_path(path)
    source = str(resolved)
    try:
        text = resolved.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            [f"<root>: cannot read the file: {error.strerror or error}"], source
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError([f"<root>: not valid YAML: {error}"], source) from None
    if overrides:
        if not isinstance(data, dict):
            raise ConfigError(["<root>: expected a mapping of config fields"], source)
        data = apply_overrides(data, overrides, source)
    return parse_config(data, source)


def config_to_dict(config: ServerConfig, *, mask_secrets: bool = True) -> dict[str, Any]:
    """The normalised config as plain data: defaults filled, ``None`` left out."""
    data = config.model_dump(mode="json", exclude_none=True)
    if mask_secrets:
        data["auth"]["api_keys"] = [MASK for _ in data["auth"]["api_keys"]]
        data["auth"]["api_key_sha256"] = [MASK for _ in data["auth"]["api_key_sha256"]]
        data["auth"]["api_keys_file_sha256"] = [MASK for _ in data["auth"]["api_keys_file_sha256"]]
    return data


def dump_config(config: ServerConfig, format: Literal["yaml", "json"] = "yaml") -> str:
    """Render the normalised config (defaults filled, API keys masked) as YAML or JSON."""
    data = config_to_dict(config)
    if format == "json":
        return json.dumps(data, indent=2) + "\n"
    if format == "yaml":
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    raise ValueError(f"format must be 'yaml' or 'json', not {format!r}")
