"""The sampler's LoRA pool: PEFT directories loaded by ``adapter_uri``, least recently used evicted.

Loading is all-or-nothing: the directory is checked (allowed location, files, base model, shapes)
before the pool changes, and a failed load leaves the pool and the model as they were.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from twinkle.errors import InvalidArgumentError, PathForbiddenError, PathNotFoundError
from twinkle.model.lora import (
    LoraRouter,
    adapter_spec_from_config,
    inject_adapter,
    load_adapter_state_dict,
    remove_adapter,
)
from twinkle.model.lora.inject import keyed_weights

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def resolve_adapter_dir(adapter_uri: str | os.PathLike, allowed_dirs: list[Path] | None) -> Path:
    """The real directory of ``adapter_uri`` (symlinks and ``..`` resolved), checked.

    Raises:
        PermissionError: When it lies outside every allowed directory.
        FileNotFoundError: When it is missing or is not a PEFT adapter directory.
    """
    uri = str(adapter_uri)
    if "://" in uri:
        scheme, _, rest = uri.partition("://")
        if scheme != "file":
            raise PathNotFoundError(
                f"adapter_uri {uri!r}: only local paths (or file://) are supported"
            )
        uri = rest
    path = Path(uri).expanduser().resolve()
    if allowed_dirs is not None and not any(path == d or d in path.parents for d in allowed_dirs):
        raise PathForbiddenError(
            f"adapter_uri {adapter_uri!r} resolves to {path}, outside the allowed adapter "
            f"directories {[str(d) for d in allowed_dirs]}"
        )
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (path / name).is_file():
            raise PathNotFoundError(
                f"adapter_uri {adapter_uri!r}: {path / name} not found (expected a PEFT adapter "
                "directory written by model.save)"
            )
    return path


def _strip_scheme(name: str) -> str:
    for scheme in ("ms://", "hf://", "tiny://", "file://"):
        if name.startswith(scheme):
            return name[len(scheme) :]
    return name


def check_base_model(config: dict, adapter_dir: Path, model_id: str, model_dir: Path) -> None:
    """Reject an adapter whose ``base_model_name_or_path`` names another model.

    Accepted: no base recorded, our model id, our resolved directory, or a directory or hub name
    with the same final component (the same tiny model or hub repo cached elsewhere).

    Raises:
        ValueError: On another base model.
    """
    base = config.get("base_model_name_or_path")
    if not base:
        return
    ours = {
        _strip_scheme(model_id),
        str(model_dir),
        Path(model_dir).name,
        Path(_strip_scheme(model_id)).name,
    }
    candidates = {base, _strip_scheme(base), Path(_strip_scheme(base)).name}
    try:
        candidates.add(str(Path(base).expanduser().resolve()))
    except OSError:
        pass
    if ours & candidates:
        return
    raise InvalidArgumentError(
        f"adapter {adapter_dir} was trained on base model {base!r}, not on this sampler's model "
        f"{model_id!r} ({model_dir})"
    )


class AdapterPool:
    """At most ``max_loras`` adapters on ``model``, keyed by their resolved directory.

    A directory whose weights file changed since it was loaded (a checkpoint saved again under
    the same name) is loaded again.
    """

    def __init__(
        self,
        model: nn.Module,
        router: LoraRouter,
        model_id: str,
        model_dir: Path,
        max_loras: int,
        allowed_dirs: list[str | os.PathLike] | None = None,
    ) -> None:
        if max_loras < 1:
            raise InvalidArgumentError(f"max_loras must be >= 1, got {max_loras}")
        self.model, self.router = model, router
        self.model_id, self.model_dir = model_id, Path(model_dir)
        self.max_loras = max_loras
        self.allowed_dirs = (
            None if allowed_dirs is None else [Path(d).expanduser().resolve() for d in allowed_dirs]
        )
        self._loaded: OrderedDict[Path, tuple[str, int]] = (
            OrderedDict()
        )  # dir -> (name, weights mtime)
        self._counter = 0
        self._in_memory: dict[str, str] = {}  # key -> adapter name; never evicted by LRU
        self._in_memory_config: dict[str, dict] = {}  # key -> the PEFT config it was built from

    def __contains__(self, adapter_uri: str) -> bool:
        try:
            return resolve_adapter_dir(adapter_uri, self.allowed_dirs) in self._loaded
        except (OSError, PermissionError):
            return False

    def loaded(self) -> list[str]:
        """Resolved directories in the pool, least recently used first."""
        return [str(p) for p in self._loaded]

    def acquire(self, adapter_uris: list[str]) -> dict[str, str]:
        """Load (or touch) every distinct uri; returns uri -> adapter name in the model.

        Raises:
            ValueError: More distinct adapters than ``max_loras`` in one call, or a bad adapter.
            FileNotFoundError, PermissionError: See :func:`resolve_adapter_dir`.
        """
        distinct = list(dict.fromkeys(adapter_uris))
        names = {uri: self._in_memory[uri] for uri in distinct if uri in self._in_memory}
        distinct = [uri for uri in distinct if uri not in names]
        for uri in distinct:
            if str(uri).startswith("inflight://"):
                raise PathNotFoundError(
                    f"adapter_uri {uri!r}: no live adapter under this name; "
                    "load_adapter_from_model(model, adapter_name) puts one here"
                )
        dirs = {uri: resolve_adapter_dir(uri, self.allowed_dirs) for uri in distinct}
        if len(set(dirs.values())) > self.max_loras:
            raise InvalidArgumentError(
                f"{len(set(dirs.values()))} distinct adapters in one call, more than max_loras={self.max_loras}"
            )
        for uri, path in dirs.items():
            names[uri] = self._load(path)
        # Evict only adapters this call does not use.
        in_use = set(dirs.values())
        for path in list(self._loaded):
            if len(self._loaded) <= self.max_loras:
                break
            if path not in in_use:
                self._evict(path)
        return names

    def put_state(self, key: str, config: dict, state: dict) -> None:
        """Load an adapter from memory (PEFT ``config`` + tensors) under ``key``, replacing the
        one there; ``acquire([key])`` then uses it. Nothing is read from or written to disk.

        The same config as before (a new step of the same adapter) copies the tensors into the
        adapter already attached; another config attaches a new one. Either way a bad state
        (keys or shapes) raises and leaves what ``key`` held unchanged.
        """
        name = self._in_memory.get(key)
        if name is not None and self._in_memory_config.get(key) == config:
            _copy_into(self.model, name, state, key)
            return
        name = self._inject("sampler-mem", config, state, where=key)
        old = self._in_memory.pop(key, None)
        self._in_memory[key] = name
        self._in_memory_config[key] = dict(config)
        if old is not None:
            remove_adapter(self.model, old)

    def has_state(self, key: str) -> bool:
        """Whether an in-memory adapter is held under ``key``."""
        return key in self._in_memory

    def _inject(self, prefix: str, config: dict, state: dict, *, where: object) -> str:
        """Attach a new adapter built from a PEFT ``config`` and its weights; returns its name."""
        self._counter += 1
        name = f"{prefix}-{self._counter}"
        spec = adapter_spec_from_config(name, {**config, "lora_dropout": 0.0})
        try:
            inject_adapter(self.model, self.router, spec)
            load_adapter_state_dict(self.model, name, state)
        except ValueError as err:
            remove_adapter(self.model, name)
            raise InvalidArgumentError(
                f"adapter {where} does not fit this sampler's base model {self.model_id!r}: {err}"
            ) from None
        return name

    def drop_state(self, key: str) -> None:
        """Remove the in-memory adapter ``key`` (no-op when absent)."""
        name = self._in_memory.pop(key, None)
        self._in_memory_config.pop(key, None)
        if name is not None:
            remove_adapter(self.model, name)

    def _load(self, path: Path) -> str:
        mtime = (path / ADAPTER_WEIGHTS).stat().st_mtime_ns
        if path in self._loaded and self._loaded[path][1] == mtime:
            self._loaded.move_to_end(path)
            return self._loaded[path][0]
        from safetensors.torch import load_file

        config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        check_base_model(config, path, self.model_id, self.model_dir)
        state = load_file(str(path / ADAPTER_WEIGHTS))
        name = self._inject("sampler", config, state, where=path)
        if path in self._loaded:
            self._evict(path)
        self._loaded[path] = (name, mtime)
        return name

    def _evict(self, path: Path) -> None:
        name, _ = self._loaded.pop(path)
        remove_adapter(self.model, name)


def live_adapter_tensors(model: Any, adapter_name: str | None) -> dict[str, torch.Tensor]:
    """``model``'s adapter weights, PEFT-keyed: the trainer's own tensors (detached, no copy)
    when it is a tenant engine in this process with the engine's own ``adapter_state_dict``,
    else its ``adapter_state_dict`` (a copy; e.g. a pipeline stage gathers the others'). Read
    them before the next step."""
    from twinkle.model.engine import TenantEngine

    tenant = model.tenant(adapter_name)  # pages the adapter in when paging is on
    module = getattr(model, "model", None)
    own = type(model).adapter_state_dict is TenantEngine.adapter_state_dict
    if not own or not isinstance(module, nn.Module):
        return model.adapter_state_dict(adapter_name)
    return {key: w.detach() for key, w in keyed_weights(module, tenant.name).items()}


def _copy_into(model: nn.Module, name: str, state: dict, where: str) -> None:
    """Copy PEFT-keyed ``state`` into adapter ``name`` in place; every key and shape is checked
    before the first tensor is copied, so a bad state changes nothing."""
    targets = keyed_weights(model, name)
    if set(targets) != set(state) or any(
        tuple(getattr(state[k], "shape", ())) != tuple(t.shape) for k, t in targets.items()
    ):
        missing, extra = sorted(set(targets) - set(state)), sorted(set(state) - set(targets))
        raise InvalidArgumentError(
            f"adapter {where} does not fit the adapter it replaces (missing {missing[:3]}, "
            f"unexpected {extra[:3]}, or other shapes)"
        )
    with torch.no_grad():
        for key, weight in targets.items():
            weight.copy_(state[key].to(weight.dtype))
