"""Model ids and the built-in offline tiny models.

``resolve_model_dir`` turns ``tiny://``, ``ms://``, ``hf://`` ids and local paths into a directory;
``load_tokenizer`` and ``load_config`` load from it. ``seed_modelscope_cache`` and
``seed_huggingface_cache`` put a local directory into a hub's cache under a repo name, so that an
offline machine serves ``ms://org/name`` (``python -m twinkle.hub seed --help``). See
``docs/models.md``.
"""

from ._cache import seed_huggingface_cache, seed_modelscope_cache
from ._resolve import (
    ModelNotFoundError,
    RemoteCodeRefusedError,
    load_config,
    load_tokenizer,
    remote_code_guard,
    resolve_model_dir,
    trust_remote_code,
)
from ._tiny import TINY_MODELS, build_tiny_model

__all__ = [
    "TINY_MODELS",
    "ModelNotFoundError",
    "RemoteCodeRefusedError",
    "build_tiny_model",
    "load_config",
    "load_tokenizer",
    "remote_code_guard",
    "resolve_model_dir",
    "seed_huggingface_cache",
    "seed_modelscope_cache",
    "trust_remote_code",
]
