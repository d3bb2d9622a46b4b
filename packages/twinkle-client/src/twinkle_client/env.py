"""Every environment variable ``twinkle_client`` reads or sets, in one place.

The client imports neither torch nor the ``twinkle`` library, so it keeps its own small
:class:`EnvVar`, with the library's spellings: booleans accept ``1``, ``true``, ``yes``, ``on`` and
``0``, ``false``, ``no``, ``off`` in any case (empty: unset), anything else is a ``ValueError``
naming the variable. Values are read when the object that needs them is built (a client, the
patched Tinker SDK). No other module of the client reads ``os.environ``
(``tests/packaging/test_env_vars.py`` enforces it); docs/configuration.md lists the variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

TRUE_SPELLINGS = ("1", "true", "yes", "on")
FALSE_SPELLINGS = ("0", "false", "no", "off")


def parse_bool(name: str, value: str) -> bool:
    """``value`` of the variable ``name`` as a boolean.

    Raises:
        ValueError: ``value`` is none of the accepted spellings; the message names ``name``.
    """
    folded = value.strip().lower()
    if folded in TRUE_SPELLINGS:
        return True
    if folded in FALSE_SPELLINGS:
        return False
    raise ValueError(
        f"environment variable {name}={value!r} is not a boolean: use one of "
        f"{'/'.join(TRUE_SPELLINGS)} or {'/'.join(FALSE_SPELLINGS)} (any case)"
    )


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable: ``name``, ``kind`` (``bool`` or ``str``), ``default`` (when it is
    unset; a boolean also when it is empty) and ``doc`` (one line, for docs/configuration.md)."""

    name: str
    kind: str
    default: T
    doc: str

    def __post_init__(self) -> None:
        if self.kind not in ("bool", "str"):
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        """The value now in ``environ`` (default: this process's environment), else ``default``.

        Raises:
            ValueError: A boolean with another spelling; the message names the variable.
        """
        raw = self.raw(environ)
        if raw is None or (self.kind == "bool" and not raw.strip()):
            return self.default
        return parse_bool(self.name, raw) if self.kind == "bool" else raw  # type: ignore[return-value]

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The value as it is written (``None`` when unset)."""
        return (os.environ if environ is None else environ).get(self.name)


TWINKLE_SERVER_URL: EnvVar[str | None] = EnvVar(
    "TWINKLE_SERVER_URL",
    "str",
    None,
    "Server address of a TwinkleClient built without base_url (unset: http://127.0.0.1:8000), "
    "and of the patched Tinker SDK.",
)
TWINKLE_SERVER_TOKEN: EnvVar[str | None] = EnvVar(
    "TWINKLE_SERVER_TOKEN",
    "str",
    None,
    "API key of a TwinkleClient built without api_key, and of the patched Tinker SDK.",
)
TWINKLE_CLIENT_DIRECT: EnvVar[bool] = EnvVar(
    "TWINKLE_CLIENT_DIRECT",
    "bool",
    True,
    "Send a model's calls straight to its replica when the server offers it (direct=None); off: "
    "every call through the gateway.",
)
TINKER_BASE_URL: EnvVar[str | None] = EnvVar(
    "TINKER_BASE_URL",
    "str",
    None,
    "The Tinker SDK's server address; init_tinker_client sets it from base_url or "
    "TWINKLE_SERVER_URL.",
)
TINKER_API_KEY: EnvVar[str | None] = EnvVar(
    "TINKER_API_KEY",
    "str",
    None,
    "The Tinker SDK's API key; init_tinker_client sets it from api_key or TWINKLE_SERVER_TOKEN "
    "(with the SDK's tml- prefix).",
)
MLFLOW_ALLOW_FILE_STORE: EnvVar[bool] = EnvVar(
    "MLFLOW_ALLOW_FILE_STORE",
    "bool",
    False,
    "Set to true (unless already set) when an MlflowTracker writes to a local file store.",
)

#: Every variable above, in the order docs/configuration.md lists them.
VARIABLES: tuple[EnvVar[Any], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, EnvVar)
)
