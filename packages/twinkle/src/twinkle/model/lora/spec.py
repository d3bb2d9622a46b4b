"""What one tenant's LoRA adapter is: rank, scaling, dropout and where it attaches."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from twinkle.errors import InvalidArgumentError

_ADAPTER_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def validate_adapter_name(name: str) -> str:
    """Adapter names become state-dict keys and directory names: keep them plain."""
    if not isinstance(name, str) or not name or not set(name) <= _ADAPTER_NAME_CHARS or "." in name:
        raise InvalidArgumentError(
            f"invalid adapter name {name!r}: use letters, digits, '_' and '-' only"
        )
    return name


@dataclass(frozen=True)
class AdapterSpec:
    """A tenant's adapter hyper-parameters, read from a ``peft.LoraConfig`` (or a dict).

    Attributes:
        name: Adapter (tenant) name.
        r: LoRA rank, > 0.
        lora_alpha: Scaling numerator.
        lora_dropout: Dropout applied to the adapter's input, per tenant.
        use_rslora: Scale by ``alpha / sqrt(r)`` instead of ``alpha / r``.
        target_modules: PEFT-style selector: ``'all-linear'``, a regex string or a list of names.
        init_lora_weights: ``True`` (A Kaiming-uniform, B zero) or ``False`` (both random, tests).
        seed: Seed of this adapter's initialisation, so adding adapters in any order gives the
            same weights.
        peft_config: The full config as a dict, written to ``adapter_config.json``.
    """

    name: str
    r: int
    lora_alpha: float
    lora_dropout: float = 0.0
    use_rslora: bool = False
    target_modules: Any = "all-linear"
    init_lora_weights: bool = True
    seed: int = 0
    peft_config: dict = field(default_factory=dict, compare=False)

    @property
    def scaling(self) -> float:
        """Multiplier of ``B @ A @ x``."""
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


def adapter_spec_from_config(name: str, config: Any, seed: int = 0) -> AdapterSpec:
    """Build an :class:`AdapterSpec` from a ``peft.LoraConfig``, a dict or a simple object.

    Raises:
        ValueError: On a non-positive rank, a negative alpha or a dropout outside [0, 1).
    """
    validate_adapter_name(name)
    if config is None:
        from peft import LoraConfig

        config = LoraConfig()
    if isinstance(config, dict):
        values = dict(config)
    elif hasattr(config, "to_dict"):
        values = config.to_dict()
    else:
        values = dict(vars(config))
    r = values.get("r", 8)
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise InvalidArgumentError(
            f"adapter {name!r}: LoRA rank r must be a positive integer, got {r!r}"
        )
    alpha = values.get("lora_alpha", 8)
    if alpha is None or alpha < 0:
        raise InvalidArgumentError(f"adapter {name!r}: lora_alpha must be >= 0, got {alpha!r}")
    dropout = float(values.get("lora_dropout", 0.0) or 0.0)
    if not 0.0 <= dropout < 1.0:
        raise InvalidArgumentError(
            f"adapter {name!r}: lora_dropout must be in [0, 1), got {dropout}"
        )
    target = values.get("target_modules") or "all-linear"
    if isinstance(target, (set, tuple)):
        target = sorted(target)
    init = values.get("init_lora_weights", True)
    if init not in (True, False):
        raise InvalidArgumentError(
            f"adapter {name!r}: init_lora_weights must be True or False, got {init!r}"
        )
    peft_config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in values.items()}
    return AdapterSpec(
        name=name,
        r=r,
        lora_alpha=float(alpha),
        lora_dropout=dropout,
        use_rslora=bool(values.get("use_rslora", False)),
        target_modules=target,
        init_lora_weights=bool(init),
        seed=seed,
        peft_config=peft_config,
    )
