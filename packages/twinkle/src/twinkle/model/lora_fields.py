"""Which ``peft.LoraConfig`` fields Twinkle honours, and the refusal of every other one.

A field either works as in peft (see :mod:`twinkle.model.lora.spec`) or, when set to anything but
peft's default, is refused with an :class:`~twinkle.errors.InvalidArgumentError` naming it and
saying why. Torch-free: the mock backend applies the same rule.
"""

from __future__ import annotations

import dataclasses
import json
import os
from enum import Enum
from pathlib import Path
from typing import Any

from twinkle.errors import InvalidArgumentError

#: ``peft.LoraConfig().to_dict()`` of peft 0.22.0 (plus ``runtime_config``, which ``to_dict``
#: leaves out); ``tests/twinkle/model/test_lora_fields.py`` checks it against the installed peft.
PEFT_DEFAULTS: dict[str, Any] = {
    "task_type": None,
    "peft_type": "LORA",
    "auto_mapping": None,
    "peft_version": None,
    "base_model_name_or_path": None,
    "revision": None,
    "inference_mode": False,
    "r": 8,
    "target_modules": None,
    "exclude_modules": None,
    "lora_alpha": 8,
    "lora_dropout": 0.0,
    "fan_in_fan_out": False,
    "bias": "none",
    "use_rslora": False,
    "modules_to_save": None,
    "init_lora_weights": True,
    "layers_to_transform": None,
    "layers_pattern": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "megatron_config": None,
    "megatron_core": "megatron.core",
    "trainable_token_indices": None,
    "loftq_config": {},
    "eva_config": None,
    "corda_config": None,
    "astra_config": None,
    "lora_ga_config": None,
    "use_dora": False,
    "velora_config": None,
    "alora_invocation_tokens": None,
    "use_qalora": False,
    "qalora_group_size": 16,
    "monteclora_config": None,
    "layer_replication": None,
    "runtime_config": {"ephemeral_gpu_offload": False},
    "lora_bias": False,
    "target_parameters": None,
    "use_bdlora": None,
    "arrow_config": None,
    "kasa_config": None,
    "ensure_weight_tying": False,
}

#: Describe the config or the saved file; they change no weight and are accepted as they are.
METADATA = frozenset(
    {
        "task_type",
        "peft_type",
        "auto_mapping",
        "peft_version",
        "base_model_name_or_path",
        "revision",
        "inference_mode",
    }
)

#: Read by :func:`twinkle.model.lora.adapter_spec_from_config` and applied as peft does.
HONOURED = frozenset(
    {
        "r",
        "lora_alpha",
        "lora_dropout",
        "use_rslora",
        "target_modules",
        "exclude_modules",
        "init_lora_weights",
        "rank_pattern",
        "alpha_pattern",
        "layers_to_transform",
        "layers_pattern",
        "target_parameters",
    }
)

#: Not peft's: a dict config may carry the adapter's init seed.
TWINKLE_KEYS = frozenset({"seed"})

_SHARED_BASE = "the base model is frozen and shared by every tenant"
_INIT_CONFIG = "configures an init_lora_weights mode Twinkle refuses"

#: Why a field is refused when it is not at peft's default.
REASONS: dict[str, str] = {
    "bias": f"only 'none': peft's 'all' / 'lora_only' train the base layers' biases, and {_SHARED_BASE}",
    "use_dora": "DoRA (a per-tenant magnitude vector over the base weight) is not implemented by the multi-LoRA op",
    "modules_to_save": f"it trains full copies of base modules, and {_SHARED_BASE}",
    "trainable_token_indices": f"it trains rows of the embedding, and {_SHARED_BASE}",
    "layer_replication": f"it duplicates base layers, and {_SHARED_BASE}",
    "fan_in_fan_out": "it is for Conv1D (GPT-2) weights; Twinkle adapts nn.Linear layers",
    "lora_bias": "a trainable lora_B bias is not implemented",
    "loftq_config": _INIT_CONFIG,
    "eva_config": _INIT_CONFIG,
    "corda_config": _INIT_CONFIG,
    "astra_config": _INIT_CONFIG,
    "lora_ga_config": _INIT_CONFIG,
    "megatron_config": "Twinkle builds the megatron model itself (backend='megatron')",
    "megatron_core": "Twinkle builds the megatron model itself (backend='megatron')",
    "runtime_config": "ephemeral GPU offload is not implemented",
}
_NOT_IMPLEMENTED = "this LoRA variant is not implemented by Twinkle's multi-LoRA layers"

#: ``init_lora_weights`` modes that subtract the initial adapter from the base weight.
BASE_REWRITING_INITS = ("pissa", "olora", "loftq", "corda", "lora_ga")


def config_values(config: Any) -> dict[str, Any]:
    """An adapter config's fields: a ``peft.LoraConfig`` (``to_dict()``), a dict, a simple
    object, or a PEFT adapter directory (its ``adapter_config.json``, as
    ``LoraConfig.from_pretrained(directory)`` reads it).

    Raises:
        InvalidArgumentError: A directory without a readable ``adapter_config.json`` object.
    """
    if isinstance(config, (str, os.PathLike)):
        path = Path(config).expanduser() / "adapter_config.json"
        try:
            values = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(
                f"config {str(config)!r}: cannot read {path}: {exc}"
            ) from None
        if not isinstance(values, dict):
            raise InvalidArgumentError(f"{path}: not a JSON object")
        return values
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(vars(config))


def check_lora_fields(values: dict[str, Any], adapter: str) -> None:
    """Refuse every field of ``values`` (a ``LoraConfig.to_dict()`` or a plain dict) that is
    neither honoured nor at peft's default.

    Args:
        values: The config's fields.
        adapter: The adapter's name, for the message.

    Raises:
        InvalidArgumentError: Naming the first refused field and why.
    """
    for key, value in values.items():
        if key in METADATA or key in HONOURED or key in TWINKLE_KEYS:
            continue
        if key not in PEFT_DEFAULTS:
            if _is_empty(_plain(value)):
                continue
            raise InvalidArgumentError(
                f"adapter {adapter!r}: LoraConfig field {key}={value!r} is refused: it is not a "
                "field Twinkle knows (written by a newer peft?)"
            )
        default = PEFT_DEFAULTS[key]
        if not _same(_plain(value), default):
            raise InvalidArgumentError(
                f"adapter {adapter!r}: LoraConfig field {key}={value!r} is refused: "
                f"{REASONS.get(key, _NOT_IMPLEMENTED)} (leave it at peft's default {default!r})"
            )


def check_init(value: Any, adapter: str) -> bool | str:
    """``init_lora_weights`` as Twinkle applies it: ``True``, ``False`` or ``'gaussian'``.

    Raises:
        InvalidArgumentError: A mode that rewrites the base weight, needs data, or is unknown.
    """
    if value is True or value is False:
        return value
    if isinstance(value, str) and value.lower() == "gaussian":
        return "gaussian"
    if isinstance(value, str) and value.lower().startswith(BASE_REWRITING_INITS):
        why = f"it rewrites the base weight (peft subtracts the initial adapter from it), and {_SHARED_BASE}"
    elif isinstance(value, str) and value.lower() == "eva":
        why = "it is data-driven (peft's initialize_lora_eva_weights pass), which Twinkle does not run"
    else:
        why = "Twinkle implements True, False and 'gaussian'"
    raise InvalidArgumentError(
        f"adapter {adapter!r}: LoraConfig field init_lora_weights={value!r} is refused: {why}"
    )


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=repr)
    return value


def _is_empty(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, (dict, list, str)) and not value)


def _same(value: Any, default: Any) -> bool:
    # None, False, {} and [] all mean "off" (older peft versions wrote null where 0.21 writes {}).
    return (_is_empty(value) and _is_empty(default)) or value == default
