"""Every environment variable the Twinkle server reads or sets, in one place.

The server is built on the library, so it uses the library's :class:`~twinkle.env.EnvVar` and its
one boolean parser, and the variables both read (the server config's path, the hub's token and
address, ``TWINKLE_TRUST_REMOTE_CODE``) are the library's own objects, listed here again so that
``VARIABLES`` is everything an operator of the server can set. No other module of the server reads
``os.environ`` (``tests/packaging/test_env_vars.py`` enforces it). docs/configuration.md lists
them.
"""

from __future__ import annotations

from typing import Any

from twinkle.env import (
    MODELSCOPE_API_TOKEN,
    MODELSCOPE_ENDPOINT,
    RAY_USAGE_STATS_ENABLED,
    TWINKLE_SERVER_CONFIG,
    TWINKLE_TRUST_REMOTE_CODE,
    EnvVar,
)

TWINKLE_RAY_NAMESPACE: EnvVar[str | None] = EnvVar(
    "TWINKLE_RAY_NAMESPACE",
    "str",
    None,
    "Ray namespace of `twinkle-server launch` when --namespace is not given (else the config's "
    "ray_namespace).",
)
RAY_ADDRESS: EnvVar[str | None] = EnvVar(
    "RAY_ADDRESS",
    "str",
    None,
    "Ray cluster that `twinkle-server launch` joins when --address is not given; unset: the "
    "local `ray start` cluster if there is one, else a Ray of its own.",
)
TWINKLE_BASE_MODEL: EnvVar[str] = EnvVar(
    "TWINKLE_BASE_MODEL",
    "str",
    "ms://Qwen/Qwen3.5-4B",
    "Base model of a server config built from device groups (twinkle.initialize(mode='http') "
    "without a config file).",
)
TWINKLE_SERVER_API_KEYS: EnvVar[str] = EnvVar(
    "TWINKLE_SERVER_API_KEYS",
    "str",
    "",
    "Comma-separated API keys the server accepts (the default of auth.api_keys_env, which can "
    "name another variable); read once at launch.",
)
TWINKLE_PROCESSOR_DATA_DIRS: EnvVar[str] = EnvVar(
    "TWINKLE_PROCESSOR_DATA_DIRS",
    "str",
    "",
    "Directories (separated by the OS path separator) from which the processor deployment loads "
    "local dataset files; unset: none.",
)
TWINKLE_CONSOLE_ADMIN_KEYS: EnvVar[str] = EnvVar(
    "TWINKLE_CONSOLE_ADMIN_KEYS",
    "str",
    "",
    "Comma-separated API keys (or their sha256 hex digests) that see the console's admin view.",
)
TWINKLE_HUB_NAMESPACE: EnvVar[str | None] = EnvVar(
    "TWINKLE_HUB_NAMESPACE",
    "str",
    None,
    "ModelScope namespace of published checkpoints when hub.namespace is not set; unset: the "
    "user owning the server's token.",
)
HF_ENDPOINT: EnvVar[str] = EnvVar(
    "HF_ENDPOINT",
    "str",
    "https://huggingface.co",
    "Address of the Hugging Face Hub that exports are published to (huggingface_hub's own "
    "variable), read per upload.",
)
TWINKLE_EXPORT_MAX_BYTES: EnvVar[float] = EnvVar(
    "TWINKLE_EXPORT_MAX_BYTES",
    "float",
    200e9,
    "Largest merged-model export the server writes, in bytes (an invalid value: the default).",
)
TWINKLE_EXPORT_TIMEOUT_S: EnvVar[float] = EnvVar(
    "TWINKLE_EXPORT_TIMEOUT_S",
    "float",
    3600.0,
    "Seconds a merged-model export may take (an invalid value: the default).",
)
TWINKLE_EXPORT_KEEP_S: EnvVar[float] = EnvVar(
    "TWINKLE_EXPORT_KEEP_S",
    "float",
    86400.0,
    "Seconds a finished export's files are kept (an invalid value: the default).",
)
TWINKLE_SERVER_URL: EnvVar[str] = EnvVar(
    "TWINKLE_SERVER_URL",
    "str",
    "http://localhost:8000",
    "Server address of `twinkle-server status` when --url is not given.",
)
TWINKLE_SERVER_TOKEN: EnvVar[str | None] = EnvVar(
    "TWINKLE_SERVER_TOKEN",
    "str",
    None,
    "API key of `twinkle-server status` when --api-key is not given.",
)

#: The library's variables that the server reads or sets too.
_SHARED: tuple[EnvVar[Any], ...] = (
    TWINKLE_SERVER_CONFIG,
    TWINKLE_TRUST_REMOTE_CODE,
    MODELSCOPE_API_TOKEN,
    MODELSCOPE_ENDPOINT,
    RAY_USAGE_STATS_ENABLED,
)
#: Every variable the server reads or sets: the shared ones, then its own.
VARIABLES: tuple[EnvVar[Any], ...] = (
    *_SHARED,
    *(
        value
        for value in list(globals().values())
        if isinstance(value, EnvVar) and value not in _SHARED
    ),
)
