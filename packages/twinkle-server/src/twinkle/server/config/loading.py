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

CONFIG_ENV = "TWINKLE_SERVER_CONFIG"
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
    chosen = path if path is not None else os.environ.get(CONFIG_ENV)
    if not chosen:
        raise ConfigError([f"<root>: no config file: pass a path or set {CONFIG_ENV}"])
    return Path(chosen).expanduser()


def load_config(path: str | os.PathLike | None = None) -> ServerConfig:
    """Load and validate the server YAML at ``path`` (default: ``$TWINKLE_SERVER_CONFIG``).

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
    return parse_config(data, source)


def config_to_dict(config: ServerConfig, *, mask_secrets: bool = True) -> dict[str, Any]:
    """The normalised config as plain data: defaults filled, ``None`` left out."""
    data = config.model_dump(mode="json", exclude_none=True)
    if mask_secrets:
        data["auth"]["api_keys"] = [MASK for _ in data["auth"]["api_keys"]]
    return data


def dump_config(config: ServerConfig, format: Literal["yaml", "json"] = "yaml") -> str:
    """Render the normalised config (defaults filled, API keys masked) as YAML or JSON."""
    data = config_to_dict(config)
    if format == "json":
        return json.dumps(data, indent=2) + "\n"
    if format == "yaml":
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    raise ValueError(f"format must be 'yaml' or 'json', not {format!r}")
