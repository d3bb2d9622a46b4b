"""``upload_adapter``: a PEFT adapter directory sent by a tenant becomes one of its checkpoints and
the weights of its adapter.

Everything is checked before anything changes: the file names (``adapter_config.json`` and
``adapter_model.safetensors``, nothing else), the config (JSON, ``peft_type`` LORA, every
LoraConfig field accepted by :mod:`twinkle.model.lora_fields`, the base model), the rank and
scaling of every module against the tenant's adapter, and every tensor's key and shape. Any
mismatch is a :class:`~twinkle.server.web.errors.BadRequest` naming what differs. Then the weights are
loaded and the files are written, atomically, into the tenant's own storage; if writing fails the
adapter gets its previous weights back.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING, Any

from twinkle.errors import InvalidArgumentError
from twinkle.model.checkpoint import ADAPTER_CONFIG, ADAPTER_WEIGHTS, atomic_directory
from twinkle.model.protocol import capabilities_of
from twinkle.server.model import protocol as p
from twinkle.server.model.host import ModelHost
from twinkle.server.model.protocol import Call
from twinkle.server.state import validate_checkpoint_name
from twinkle.server.web.errors import BadRequest

if TYPE_CHECKING:
    import torch

UPLOAD_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
"""The only files an upload may carry."""

_PEFT_PREFIX = "base_model.model."


def upload_adapter(service: ModelHost, call: Call, request: p.UploadAdapter) -> dict[str, str]:
    """Validate the uploaded adapter files, load them into the caller's adapter and store them as
    its checkpoint ``twinkle://<run>/weights/<name>``."""
    entry = service.entry(call)
    name = validate_checkpoint_name(request.name)
    model = service.model
    capabilities = capabilities_of(model)
    if not capabilities.adapter_state_io:
        raise BadRequest(f"the {type(model).__name__} backend does not accept uploaded adapters")
    raw = _decode_files(request.files)
    config = _parse_config(raw[ADAPTER_CONFIG])
    _check_base_model(config, service)
    current = model.adapter_state_dict(adapter_name=call.internal)
    uploaded = _parse_weights(raw[ADAPTER_WEIGHTS])
    _check_tensors(uploaded, current, call.name)
    _check_scaling(config, entry.lora_config, sorted(_modules(current)), call.name)

    model.load_adapter_state_dict(uploaded, adapter_name=call.internal)
    try:
        target = service.registry.checkpoint_dir(entry.owner, entry.run_id, "weights", name)
        with atomic_directory(target) as tmp:
            for filename in UPLOAD_FILES:
                (tmp / filename).write_bytes(raw[filename])
        path = service.registry.add_checkpoint(entry.owner, entry.run_id, "weights", name)
    except BaseException:
        model.load_adapter_state_dict(current, adapter_name=call.internal)
        raise
    return {"path": path}


def _decode_files(files: dict[str, str]) -> dict[str, bytes]:
    extra = sorted(set(files) - set(UPLOAD_FILES))
    if extra:
        raise BadRequest(
            f"files: {', '.join(map(repr, extra))} refused: an upload carries only "
            f"{' and '.join(UPLOAD_FILES)}"
        )
    missing = [f for f in UPLOAD_FILES if f not in files]
    if missing:
        raise BadRequest(f"files: {', '.join(missing)} missing")
    raw = {}
    for filename, text in files.items():
        try:
            raw[filename] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"files.{filename}: not valid base64") from None
    return raw


def _parse_config(data: bytes) -> dict[str, Any]:
    try:
        config = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"{ADAPTER_CONFIG}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise BadRequest(f"{ADAPTER_CONFIG}: must be a JSON object, got {type(config).__name__}")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise BadRequest(f"{ADAPTER_CONFIG}: peft_type={peft_type!r}; only LORA adapters load")
    return config


def _tail(name: Any) -> str:
    return str(name).split("://")[-1].rstrip("/").rsplit("/", 1)[-1].lower()


def _check_base_model(config: dict[str, Any], service: ModelHost) -> None:
    """``base_model_name_or_path`` (when set) names this base model: a hub id or a local
    directory whose last component is the served model's (``Qwen/Qwen3.5-4B``,
    ``/models/Qwen3.5-4B``). The tensor shapes are the real check; this one catches an adapter of
    another model of the same architecture."""
    declared = config.get("base_model_name_or_path")
    if not declared:
        return
    model = service.model
    ours = [service.base_model, getattr(model, "model_id", None), getattr(model, "model_dir", None)]
    if _tail(declared) not in {_tail(n) for n in ours if n}:
        raise BadRequest(
            f"{ADAPTER_CONFIG}: base_model_name_or_path={declared!r} is not this server's base "
            f"model {service.base_model!r}"
        )


def _parse_weights(data: bytes) -> dict[str, torch.Tensor]:
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        state = load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise BadRequest(f"{ADAPTER_WEIGHTS}: not a safetensors file ({exc})") from None
    for key, tensor in state.items():
        if not tensor.is_floating_point():
            raise BadRequest(f"{ADAPTER_WEIGHTS}: {key} has dtype {tensor.dtype}, not a float")
        if not bool(torch.isfinite(tensor).all()):
            raise BadRequest(f"{ADAPTER_WEIGHTS}: {key} has non-finite values")
    return state


def _check_tensors(uploaded: dict, current: dict, adapter: str) -> None:
    missing = sorted(set(current) - set(uploaded))
    unexpected = sorted(set(uploaded) - set(current))
    if missing or unexpected:
        raise BadRequest(
            f"{ADAPTER_WEIGHTS} does not fit adapter {adapter!r}: missing {_few(missing)}, "
            f"unexpected {_few(unexpected)} (is the adapter created with the same target_modules?)"
        )
    for key, tensor in current.items():
        if tuple(uploaded[key].shape) != tuple(tensor.shape):
            raise BadRequest(
                f"{ADAPTER_WEIGHTS}: {key} has shape {tuple(uploaded[key].shape)}, adapter "
                f"{adapter!r} has {tuple(tensor.shape)} (another rank or base model?)"
            )


def _few(keys: list[str]) -> str:
    return f"{keys[:3]}{'...' if len(keys) > 3 else ''}"


def _modules(state: dict) -> set[str]:
    return {key[len(_PEFT_PREFIX) :].rsplit(".", 2)[0] for key in state}


def _spec_name(adapter: str) -> str:
    from twinkle.model.lora.spec import validate_adapter_name

    try:
        return validate_adapter_name(adapter)  # the name in messages about the config's fields
    except InvalidArgumentError:
        return "uploaded"


def _check_scaling(
    config: dict[str, Any], created_with: dict[str, Any], modules: list[str], adapter: str
) -> None:
    """Every LoraConfig field is one Twinkle honours, and every module gets the rank and scaling
    the tenant's adapter (created with ``created_with``) gives it, else the loaded weights would
    not compute what they computed where they were trained."""
    from twinkle.model.lora.spec import adapter_spec_from_config

    try:
        theirs = adapter_spec_from_config(_spec_name(adapter), config)
    except (InvalidArgumentError, TypeError, ValueError) as exc:
        raise BadRequest(f"{ADAPTER_CONFIG}: {exc}") from None
    spec = adapter_spec_from_config(_spec_name(adapter), created_with)
    for module in modules:
        a, b = theirs.for_module(module), spec.for_module(module)
        if (a.r, a.scaling) != (b.r, b.scaling):
            raise BadRequest(
                f"{ADAPTER_CONFIG}: module {module} has r={a.r}, lora_alpha={a.lora_alpha:g}, "
                f"use_rslora={a.use_rslora} (scaling {a.scaling:g}); adapter {adapter!r} has "
                f"r={b.r}, lora_alpha={b.lora_alpha:g}, use_rslora={b.use_rslora} (scaling "
                f"{b.scaling:g}): create the adapter from this {ADAPTER_CONFIG}"
            )


__all__ = ["UPLOAD_FILES", "upload_adapter"]
