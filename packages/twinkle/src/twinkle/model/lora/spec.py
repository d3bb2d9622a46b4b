"""What one tenant's LoRA adapter is: rank, scaling, dropout and where it attaches."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from twinkle.errors import InvalidArgumentError
from twinkle.model.lora_fields import check_init, check_lora_fields, config_values

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

    Every field means what it means in peft; :mod:`twinkle.model.lora_fields` refuses the
    LoraConfig fields Twinkle does not implement.

    Attributes:
        name: Adapter (tenant) name.
        r: LoRA rank, > 0 (layers named in ``rank_pattern`` take theirs).
        lora_alpha: Scaling numerator (layers named in ``alpha_pattern`` take theirs).
        lora_dropout: Dropout applied to the adapter's input in training passes, per tenant.
        use_rslora: Scale by ``alpha / sqrt(r)`` instead of ``alpha / r``.
        target_modules: PEFT-style selector: ``'all-linear'``, a regex string or a list of names
            (an empty list with ``target_parameters``: no linear layer).
        target_parameters: PEFT's selector of bare parameters: names or name suffixes of MoE
            expert weights (``'gate_up_proj'``, ``'mlp.experts.down_proj'``); see
            :mod:`twinkle.model.lora.experts`.
        exclude_modules: Modules never adapted: a regex string or a list of names / suffixes.
        init_lora_weights: ``True`` (A Kaiming-uniform, B zero), ``'gaussian'`` (A normal with
            std ``1/r``, B zero) or ``False`` (A and B as ``nn.Linear`` initialises them).
        rank_pattern: ``{pattern: rank}``, matched against module names as peft does.
        alpha_pattern: ``{pattern: alpha}``, likewise.
        layers_to_transform: Layer indices to adapt (list ``target_modules`` only).
        layers_pattern: Name(s) of the layer list in module names (``'layers'``).
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
    target_parameters: tuple[str, ...] = ()
    exclude_modules: Any = None
    init_lora_weights: bool | str = True
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    layers_to_transform: tuple[int, ...] | None = None
    layers_pattern: tuple[str, ...] | None = None
    seed: int = 0
    peft_config: dict = field(default_factory=dict, compare=False)

    @property
    def scaling(self) -> float:
        """Multiplier of ``B @ A @ x`` (of the layers outside ``rank_pattern``/``alpha_pattern``)."""
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    def for_module(self, module_name: str) -> AdapterSpec:
        """This spec with the rank and alpha of module ``module_name`` (its full name), the
        first ``rank_pattern`` / ``alpha_pattern`` key matching it, as peft's
        ``get_pattern_key`` picks it."""
        r = self.rank_pattern.get(_pattern_key(self.rank_pattern, module_name), self.r)
        alpha = self.alpha_pattern.get(
            _pattern_key(self.alpha_pattern, module_name), self.lora_alpha
        )
        return replace(self, r=r, lora_alpha=float(alpha), rank_pattern={}, alpha_pattern={})


def _pattern_key(patterns: dict[str, Any], module_name: str) -> str:
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module_name):
            return key
    return module_name


def adapter_spec_from_config(name: str, config: Any, seed: int = 0) -> AdapterSpec:
    """Build an :class:`AdapterSpec` from a ``peft.LoraConfig``, a dict, a simple object or a
    PEFT adapter directory (its ``adapter_config.json``).

    ``target_modules`` left unset means ``'all-linear'``. A dict may carry ``seed`` (the
    adapter's init seed, instead of ``seed``).

    Raises:
        InvalidArgumentError: A bad rank, alpha, dropout or pattern, or a LoraConfig field
            Twinkle does not implement (named in the message, with the reason).
    """
    validate_adapter_name(name)
    if config is None:
        from peft import LoraConfig

        config = LoraConfig()
    values = config_values(config)
    check_lora_fields(values, name)
    r = _rank(values.get("r", 8), name, "r")
    alpha = _alpha(values.get("lora_alpha", 8), name, "lora_alpha")
    dropout = float(values.get("lora_dropout", 0.0) or 0.0)
    if not 0.0 <= dropout < 1.0:
        raise InvalidArgumentError(
            f"adapter {name!r}: lora_dropout must be in [0, 1), got {dropout}"
        )
    parameters = _target_parameters(values.get("target_parameters"), name)
    if parameters and dropout:
        raise InvalidArgumentError(
            f"adapter {name!r}: lora_dropout must be 0 with target_parameters (as in peft: "
            "dropout cannot be factored out of an adapted weight)"
        )
    target = values.get("target_modules")
    if isinstance(target, (set, tuple)):
        target = sorted(target)
    if not target and not (parameters and target == []):
        target = "all-linear"
    layers, layers_pattern = _layer_selection(values, target, name)
    exclude = values.get("exclude_modules") or None
    if isinstance(exclude, (set, tuple)):
        exclude = sorted(exclude)
    peft_config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in values.items()}
    return AdapterSpec(
        name=name,
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        use_rslora=bool(values.get("use_rslora", False)),
        target_modules=target,
        target_parameters=parameters,
        exclude_modules=exclude,
        init_lora_weights=check_init(values.get("init_lora_weights", True), name),
        rank_pattern={
            str(k): _rank(v, name, f"rank_pattern[{k!r}]")
            for k, v in (values.get("rank_pattern") or {}).items()
        },
        alpha_pattern={
            str(k): _alpha(v, name, f"alpha_pattern[{k!r}]")
            for k, v in (values.get("alpha_pattern") or {}).items()
        },
        layers_to_transform=layers,
        layers_pattern=layers_pattern,
        seed=int(values.get("seed", seed)),
        peft_config=peft_config,
    )


def _target_parameters(value: Any, adapter: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set)) or not all(
        isinstance(v, str) and v for v in value
    ):
        raise InvalidArgumentError(
            f"adapter {adapter!r}: target_parameters must be a list of parameter names, "
            f"got {value!r}"
        )
    return tuple(sorted(set(value)))


def _rank(value: Any, adapter: str, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidArgumentError(
            f"adapter {adapter!r}: LoRA rank {what} must be a positive integer, got {value!r}"
        )
    return value


def _alpha(value: Any, adapter: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise InvalidArgumentError(f"adapter {adapter!r}: {what} must be >= 0, got {value!r}")
    return float(value)


def _layer_selection(values: dict[str, Any], target: Any, adapter: str):
    layers = values.get("layers_to_transform")
    pattern = values.get("layers_pattern") or None
    if layers is None or layers == []:
        if pattern is not None:
            raise InvalidArgumentError(
                f"adapter {adapter!r}: layers_pattern needs layers_to_transform (as in peft)"
            )
        return None, None
    if isinstance(target, str):
        raise InvalidArgumentError(
            f"adapter {adapter!r}: layers_to_transform cannot be used when target_modules is a "
            f"string ({target!r}), as in peft: list the module names"
        )
    layers = (layers,) if isinstance(layers, int) else tuple(layers)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
        raise InvalidArgumentError(
            f"adapter {adapter!r}: layers_to_transform must be layer indices, got {layers!r}"
        )
    if pattern is not None:
        pattern = (pattern,) if isinstance(pattern, str) else tuple(pattern)
    return layers, pattern
