"""Every environment variable the ``twinkle`` library reads or sets, in one place.

Each variable is an :class:`EnvVar`: its name, its type, its default and what it does. Code reads
a variable through ``VAR.get()`` where the object that needs it is built (a model, a tokenizer, a
dataset source, the logger), never on a per-step path; the Triton interpreter flag is read once
per process (:func:`triton_interpret`). No other module of the library reads ``os.environ``
(``tests/packaging/test_env_vars.py`` enforces it); setting a variable for a child process stays
where it happens, named through the constant here.

Booleans have one spelling everywhere: ``1``, ``true``, ``yes``, ``on`` and ``0``, ``false``,
``no``, ``off``, in any case; an empty value is unset; anything else is a ``ValueError`` naming
the variable. A string variable set to the empty string is returned as it is. docs/configuration.md lists the variables of all three distributions.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

TRUE_SPELLINGS = ("1", "true", "yes", "on")
FALSE_SPELLINGS = ("0", "false", "no", "off")


def parse_bool(name: str, value: str) -> bool:
    """``value`` of the variable ``name`` as a boolean (see the module docstring).

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


def _parse_number(kind: Callable[[str], T]) -> Callable[[str, str], T]:
    def parse(name: str, value: str) -> T:
        try:
            return kind(value.strip())
        except ValueError:
            raise ValueError(
                f"environment variable {name}={value!r} is not a valid {kind.__name__}"
            ) from None

    return parse


def _parse_str(name: str, value: str) -> str:
    return value


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "bool": parse_bool,
    "int": _parse_number(int),
    "float": _parse_number(float),
    "str": _parse_str,
}


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable: ``name``, ``kind`` (``bool``, ``int``, ``float`` or ``str``),
    ``default`` (returned when it is unset; a boolean or a number also when it is empty) and
    ``doc`` (one line, for docs/configuration.md)."""

    name: str
    kind: str
    default: T
    doc: str

    def __post_init__(self) -> None:
        if self.kind not in _PARSERS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        """The value now in ``environ`` (default: this process's environment), else ``default``.

        Raises:
            ValueError: The value does not parse as ``kind``; the message names the variable.
        """
        raw = self.raw(environ)
        if raw is None or (self.kind != "str" and not raw.strip()):
            return self.default
        return _PARSERS[self.kind](self.name, raw)

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether the variable holds a non-empty value."""
        return bool(self.raw(environ))

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The value as it is written (``None`` when unset), to pass on to another process."""
        return (os.environ if environ is None else environ).get(self.name)


def environ() -> Mapping[str, str]:
    """This process's environment, read-only, for functions that take an ``environ`` mapping
    (tests pass their own) and for variables an operator names in a config file."""
    return types.MappingProxyType(os.environ)


def with_prefix(prefix: str) -> dict[str, str]:
    """Every variable whose name starts with ``prefix``, with its value (to pass on to workers)."""
    return {k: v for k, v in os.environ.items() if k.startswith(prefix)}


# Where things go.
TWINKLE_OUTPUT_DIR: EnvVar[str] = EnvVar(
    "TWINKLE_OUTPUT_DIR",
    "str",
    "output",
    "Directory under which checkpoints (one folder per adapter) and the demo's files are written.",
)
TWINKLE_CACHE_DIR: EnvVar[str | None] = EnvVar(
    "TWINKLE_CACHE_DIR",
    "str",
    None,
    "Root of twinkle's own cache (the built tiny models); unset: ~/.cache/twinkle.",
)
TWINKLE_LOG_LEVEL: EnvVar[str] = EnvVar(
    "TWINKLE_LOG_LEVEL",
    "str",
    "INFO",
    "Level of the 'twinkle' logger when twinkle configures logging itself.",
)

# Models and the hubs.
TWINKLE_TRUST_REMOTE_CODE: EnvVar[bool] = EnvVar(
    "TWINKLE_TRUST_REMOTE_CODE",
    "bool",
    False,
    "Let a model repository's own Python code run (transformers' trust_remote_code) when a "
    "model, tokenizer or image processor is loaded.",
)
TWINKLE_OFFLINE: EnvVar[bool] = EnvVar(
    "TWINKLE_OFFLINE",
    "bool",
    False,
    "Never download: models and datasets come from the local caches only (both hubs).",
)
HF_HUB_OFFLINE: EnvVar[bool] = EnvVar(
    "HF_HUB_OFFLINE",
    "bool",
    False,
    "huggingface_hub's switch, also honoured by twinkle: no downloads from either hub.",
)
TRANSFORMERS_OFFLINE: EnvVar[bool] = EnvVar(
    "TRANSFORMERS_OFFLINE",
    "bool",
    False,
    "transformers' switch, also honoured by twinkle: no model downloads from the Hugging Face Hub.",
)
HF_DATASETS_OFFLINE: EnvVar[bool] = EnvVar(
    "HF_DATASETS_OFFLINE",
    "bool",
    False,
    "datasets' switch, also honoured by twinkle: no dataset downloads.",
)
MODELSCOPE_OFFLINE: EnvVar[bool] = EnvVar(
    "MODELSCOPE_OFFLINE",
    "bool",
    False,
    "No downloads from ModelScope (models and datasets).",
)
MODELSCOPE_CACHE: EnvVar[str | None] = EnvVar(
    "MODELSCOPE_CACHE",
    "str",
    None,
    "modelscope's cache root, where twinkle looks for models; unset: ~/.cache/modelscope/hub.",
)
MODELSCOPE_ENDPOINT: EnvVar[str | None] = EnvVar(
    "MODELSCOPE_ENDPOINT",
    "str",
    None,
    "Address of the ModelScope hub that uploads go to; unset: modelscope's own default.",
)
MODELSCOPE_API_TOKEN: EnvVar[str | None] = EnvVar(
    "MODELSCOPE_API_TOKEN",
    "str",
    None,
    "ModelScope token for uploads when none is passed; unset: the saved `modelscope login`.",
)

# Execution.
TWINKLE_LORA_KERNEL: EnvVar[str | None] = EnvVar(
    "TWINKLE_LORA_KERNEL",
    "str",
    None,
    "Default of ExecutionOptions.lora_kernel (auto, torch or triton), read when the options are "
    "built from the environment.",
)
TWINKLE_MALLOC_TUNING: EnvVar[bool] = EnvVar(
    "TWINKLE_MALLOC_TUNING",
    "bool",
    True,
    "Default of ExecutionOptions.malloc_tuning; off keeps glibc's allocator settings as they are.",
)
TRITON_INTERPRET: EnvVar[bool] = EnvVar(
    "TRITON_INTERPRET",
    "bool",
    False,
    "Run the Triton LoRA kernels in Triton's interpreter (CPU tensors); read once per process, "
    "at the first kernel launch.",
)
TWINKLE_MEGATRON_THREADS: EnvVar[int] = EnvVar(
    "TWINKLE_MEGATRON_THREADS",
    "int",
    1,
    "torch CPU threads of each megatron rank; every TWINKLE_MEGATRON_* variable of the driver "
    "reaches ranks started through Ray.",
)
CUDA_VISIBLE_DEVICES: EnvVar[str | None] = EnvVar(
    "CUDA_VISIBLE_DEVICES",
    "str",
    None,
    "Reported (placement report, CPU fallback warning), never changed by twinkle.",
)
TWINKLE_SERVER_CONFIG: EnvVar[str | None] = EnvVar(
    "TWINKLE_SERVER_CONFIG",
    "str",
    None,
    "Path of the server's YAML config when none is passed (twinkle.initialize(mode='http'), "
    "twinkle-server).",
)

# Set by twinkle (the values they get are in docs/configuration.md).
RAY_USAGE_STATS_ENABLED: EnvVar[bool] = EnvVar(
    "RAY_USAGE_STATS_ENABLED",
    "bool",
    True,
    "Set to 0 (unless already set) before twinkle starts Ray: no usage report.",
)
RAYON_NUM_THREADS: EnvVar[str | None] = EnvVar(
    "RAYON_NUM_THREADS",
    "str",
    None,
    "Set to 1 while a tiny model's tokenizer is trained (identical files run to run), then "
    "restored.",
)

#: Every variable above, in the order docs/configuration.md lists them.
VARIABLES: tuple[EnvVar[Any], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, EnvVar)
)


@functools.cache
def triton_interpret() -> bool:
    """``TRITON_INTERPRET``, read once per process, at its first use (the first kernel launch).

    Triton reads the same variable when it decorates a kernel, which the LoRA kernels do at that
    first launch too; :func:`refresh` makes the next use read it again.
    """
    return TRITON_INTERPRET.get()


def refresh() -> None:
    """Forget the values read once per process, so that their next use reads the environment."""
    triton_interpret.cache_clear()
