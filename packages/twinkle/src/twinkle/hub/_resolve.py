"""Model ids -> local directories: ``tiny://``, ``ms://``, ``hf://`` and plain paths."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path

from twinkle.env import (
    HF_HUB_OFFLINE,
    MODELSCOPE_OFFLINE,
    TRANSFORMERS_OFFLINE,
    TWINKLE_OFFLINE,
    TWINKLE_TRUST_REMOTE_CODE,
    EnvVar,
)
from twinkle.errors import InvalidArgumentError, ModelNotFoundError, RemoteCodeRefusedError

from ._cache import download_modelscope, find_huggingface, find_modelscope
from ._tiny import TINY_MODELS, materialize_tiny_model

SCHEMES = ("tiny://", "ms://", "hf://")


def trust_remote_code() -> bool:
    """Whether ``TWINKLE_TRUST_REMOTE_CODE`` (``1``/``true``/``yes``/``on``) lets a model
    repository's own code run; off when unset."""
    return TWINKLE_TRUST_REMOTE_CODE.get()


@contextlib.contextmanager
def remote_code_guard(model_dir: str | os.PathLike[str]) -> Iterator[bool]:
    """Yield the ``trust_remote_code`` value for loading ``model_dir`` with transformers.

    With the switch off, transformers refuses (before importing anything) a model that needs
    the repository's own code, telling the caller to pass ``trust_remote_code=True``, which a
    Twinkle user cannot; the refusal is re-raised naming the switch that decides it.
    """
    trusted = trust_remote_code()
    try:
        yield trusted
    except ValueError as error:
        if trusted or "trust_remote_code" not in str(error):
            raise
        modules = sorted(p.name for p in Path(model_dir).glob("*.py"))
        raise RemoteCodeRefusedError(
            f"model {os.fspath(model_dir)!r} needs code from its repository "
            f"({', '.join(modules) or 'auto_map'}) and TWINKLE_TRUST_REMOTE_CODE is off, so it "
            "is not run and the model does not load. Set TWINKLE_TRUST_REMOTE_CODE=1 only for "
            "a repository you trust."
        ) from None


def _env_flag(*variables: EnvVar[bool]) -> bool:
    return any(variable.get() for variable in variables)


def _hf_offline() -> bool:
    return _env_flag(TWINKLE_OFFLINE, HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE)


def _ms_offline() -> bool:
    return _env_flag(TWINKLE_OFFLINE, MODELSCOPE_OFFLINE, HF_HUB_OFFLINE)


def _not_found(model_id: str, where: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model {model_id!r} is not in the {where} and downloads are disabled "
        "(TWINKLE_OFFLINE / HF_HUB_OFFLINE is set). Fix: download it once while online, pass a "
        "local directory instead, or use a built-in offline model such as 'tiny://qwen3.5' "
        f"(valid tiny names: {', '.join(sorted(TINY_MODELS))})."
    )


def _repo_id(model_id: str, scheme: str) -> str:
    repo_id = model_id[len(scheme) :].strip("/")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise InvalidArgumentError(f"{model_id!r}: expected {scheme}<org>/<name>")
    return repo_id


def _resolve_modelscope(model_id: str) -> Path:
    repo_id = _repo_id(model_id, "ms://")
    cached = find_modelscope(repo_id)
    if cached is not None and (cached / "config.json").is_file():
        return cached
    if _ms_offline():
        raise _not_found(model_id, "ModelScope cache (MODELSCOPE_CACHE or ~/.cache/modelscope/hub)")
    try:
        return download_modelscope(repo_id)
    except Exception as exc:
        raise ModelNotFoundError(f"could not download {model_id!r} from ModelScope: {exc}") from exc


def _resolve_huggingface(model_id: str) -> Path:
    repo_id = _repo_id(model_id, "hf://")
    cached = find_huggingface(repo_id)
    if cached is not None:
        return cached
    if _hf_offline():
        raise _not_found(model_id, "Hugging Face cache (HF_HOME / HF_HUB_CACHE)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id))
    except Exception as exc:
        raise ModelNotFoundError(
            f"could not download {model_id!r} from Hugging Face: {exc}"
        ) from exc


def _tiny_name(model_id: str) -> str | None:
    for prefix in ("tiny://", "tiny/"):
        if model_id.startswith(prefix):
            return model_id[len(prefix) :].strip("/")
    return None


def resolve_model_dir(model_id: str) -> Path:
    """Return the local directory holding a model's config, weights and tokenizer.

    Args:
        model_id: one of ``tiny://<name>`` (or ``tiny/<name>``, the ``org/name`` form servers use),
            ``ms://<org>/<name>`` (ModelScope), ``hf://<org>/<name>`` (Hugging Face), a bare
            ``<org>/<name>`` (treated as ModelScope) or an existing local directory.

    Returns:
        Path of the model directory. Tiny models are built into the twinkle cache on first use.

    Raises:
        ModelNotFoundError: the model is not cached locally and downloads are disabled (offline)
            or failed; also for a local-looking path that does not exist.
        ValueError: unknown scheme or unknown tiny model name.
    """
    model_id = os.fspath(model_id)
    tiny = _tiny_name(model_id)
    if tiny is not None:
        if tiny not in TINY_MODELS:
            raise InvalidArgumentError(
                f"unknown tiny model {model_id!r}; valid: "
                + ", ".join(f"tiny://{name}" for name in sorted(TINY_MODELS))
            )
        return materialize_tiny_model(tiny)
    if model_id.startswith("ms://"):
        return _resolve_modelscope(model_id)
    if model_id.startswith("hf://"):
        return _resolve_huggingface(model_id)
    if "://" in model_id:
        raise InvalidArgumentError(
            f"unknown model id scheme in {model_id!r}; valid: {', '.join(SCHEMES)} or a local directory"
        )
    path = Path(model_id).expanduser()
    if path.is_dir():
        return path
    if model_id.startswith(("/", ".", "~")) or model_id.count("/") != 1:
        raise ModelNotFoundError(f"model directory {model_id!r} does not exist")
    return _resolve_modelscope(f"ms://{model_id}")


@functools.lru_cache(maxsize=32)
def _load_tokenizer_from_dir(model_dir: Path):
    from transformers import AutoTokenizer

    with remote_code_guard(model_dir) as trust:
        return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust)


def load_tokenizer(model_id: str):
    """Load the fast tokenizer of a model id (cached per resolved directory).

    The same object is returned for repeated calls: treat it as read-only.
    """
    return _load_tokenizer_from_dir(resolve_model_dir(model_id).resolve())


def load_config(model_id: str):
    """Load the transformers config (``AutoConfig``) of a model id."""
    from transformers import AutoConfig

    model_dir = resolve_model_dir(model_id)
    with remote_code_guard(model_dir) as trust:
        return AutoConfig.from_pretrained(model_dir, trust_remote_code=trust)
