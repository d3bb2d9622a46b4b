"""Attach adapters to a transformers model and move their weights in PEFT's layout."""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Iterable
from typing import Any

import regex
import torch
from torch import nn

from twinkle.errors import InvalidArgumentError
from twinkle.model.lora.experts import EXPERT_PARAMS, MultiLoraExperts, is_experts_module
from twinkle.model.lora.layer import LoraRouter, MultiLoraLinear
from twinkle.model.lora.spec import AdapterSpec

PEFT_PREFIX = "base_model.model."
#: Module-name prefixes of a multimodal model's vision tower and projector (Qwen-VL, Qwen3.5).
VISION_PREFIXES = ("model.visual.", "visual.")
#: Longest regex a selector (``target_modules``, ``exclude_modules``, ``layers_pattern``) may be.
MAX_SELECTOR_CHARS = 512
#: Matching time one adapter's selectors may take against all of the model's module names.
SELECTOR_BUDGET_S = 1.0


def is_vision_module(name: str) -> bool:
    """Whether module ``name`` belongs to the vision tower (or its merger / projector)."""
    return name.startswith(VISION_PREFIXES)


def _output_layer_names(model: nn.Module) -> set[str]:
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if get_out else None
    return {name for name, module in model.named_modules() if out is not None and module is out}


def resolve_target_modules(
    model: nn.Module,
    target_modules,
    exclude_modules=None,
    layers_to_transform=None,
    layers_pattern=None,
) -> list[str]:
    """Full module names a PEFT selector picks among the model's linears, as peft picks them.

    ``'all-linear'`` takes every linear layer but the output (LM head) layer and, on a multimodal
    model, those of the vision tower and its merger (the language model is what tenants adapt by
    default; name vision modules, e.g. ``['qkv', 'attn.proj']`` or a regex, to adapt them too,
    per tenant); another string is a
    regex matched against the full name; a list matches names or name suffixes (the LM head too,
    when named). ``exclude_modules`` (regex or list, the same way) drops names;
    ``layers_to_transform`` keeps, for a list selector, the layers with those indices (the
    number after ``layers_pattern``, or after the first ``<name>.`` with none).

    A regex must compile with Python's ``re`` (as peft reads it), be at most
    :data:`MAX_SELECTOR_CHARS` long, and is matched with a time budget of
    :data:`SELECTOR_BUDGET_S` for all names together, so that no pattern can hold the model.

    Raises:
        InvalidArgumentError: The selector matches no linear layer, is malformed, or costs more
            than the budget to match; the message names the field.
    """
    budget = _Budget(SELECTOR_BUDGET_S)
    all_linear = target_modules == "all-linear"
    target = None if all_linear else Selector("target_modules", target_modules)
    exclude = Selector("exclude_modules", exclude_modules) if exclude_modules else None
    excluded = _output_layer_names(model) if all_linear else set()
    candidates = [
        name
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, MultiLoraLinear)) and not _inside_lora(name)
    ]
    linears = [
        name
        for name in candidates
        if name not in excluded
        and not (all_linear and is_vision_module(name))
        and not (exclude is not None and exclude.selects(name, budget))
    ]
    if target is None:
        chosen = linears
    else:
        chosen = [n for n in linears if target.selects(n, budget)]
        if layers_to_transform is not None and not isinstance(target_modules, str):
            layers = set(layers_to_transform)
            chosen = [n for n in chosen if _layer_index(n, layers_pattern, budget) in layers]
    if not chosen:
        kinds = sorted({name.rsplit(".", 1)[-1] for name in candidates})
        raise InvalidArgumentError(
            f"target_modules={target_modules!r} (exclude_modules={exclude_modules!r}, "
            f"layers_to_transform={layers_to_transform!r}) matches no linear layer of the "
            f"model; its linear layers end in {', '.join(kinds[:16])}"
            f"{', ...' if len(kinds) > 16 else ''}"
        )
    return chosen


class _Budget:
    """What is left of one adapter's matching time, shared by all its selectors."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 1e-3)


class Selector:
    """A PEFT module selector checked once: a regex (full match) or a list of names / suffixes.

    The regex is read by Python's ``re`` first (peft's engine: a pattern it refuses is refused
    here too), then matched with the ``regex`` engine, whose ``timeout`` bounds the cost of a
    pattern that backtracks without end (``(.|.)*x``) where ``re`` cannot be interrupted.

    Raises:
        InvalidArgumentError: Neither a string nor a list of strings, a regex over
            :data:`MAX_SELECTOR_CHARS` characters, or one that does not compile.
    """

    def __init__(self, field: str, selector: Any) -> None:
        self.field, self.selector = field, selector
        self.names: tuple[str, ...] = ()
        self.pattern = None
        if isinstance(selector, str):
            self.pattern = compile_selector(field, selector)
        elif _is_name_list(selector):
            self.names = tuple(selector)
        else:
            raise InvalidArgumentError(
                f"{field} must be a regex string or a list of module names, got {selector!r}"
            )

    def selects(self, name: str, budget: _Budget) -> bool:
        if self.pattern is None:
            return any(name == t or name.endswith("." + t) for t in self.names)
        found = bounded_match(self.pattern, name, budget, self.field, self.selector, "fullmatch")
        return found is not None


def compile_selector(field: str, pattern: str) -> Any:
    """``pattern`` compiled for :func:`bounded_match`, after the checks of :class:`Selector`."""
    if len(pattern) > MAX_SELECTOR_CHARS:
        raise InvalidArgumentError(
            f"{field} is a regex of {len(pattern)} characters, longer than "
            f"{MAX_SELECTOR_CHARS}; list module names instead"
        )
    try:
        re.compile(pattern)
        return regex.compile(pattern, regex.VERSION0)
    except (re.error, regex.error) as exc:
        raise InvalidArgumentError(
            f"{field}={pattern!r} is not a valid regular expression: {exc}"
        ) from None


def bounded_match(
    pattern: Any, name: str, budget: _Budget, field: str, shown: Any, how: str = "match"
) -> Any:
    """``pattern.<how>(name)`` within what is left of ``budget``.

    Raises:
        InvalidArgumentError: The budget ran out: ``field`` costs too much to match.
    """
    try:
        return getattr(pattern, how)(name, timeout=budget.left())
    except TimeoutError:
        raise InvalidArgumentError(
            f"{field}={shown!r} costs too much to match against the model's module names "
            f"(over {budget.seconds:g} s): simplify the pattern (no nested or alternated "
            "repeats such as '(.*)*' or '(a|.)*') or list module names"
        ) from None


def _selects(selector: Any, name: str) -> bool:
    """Whether ``selector`` (regex or name list) picks module ``name``, within its own budget."""
    return Selector("target_modules", selector).selects(name, _Budget(SELECTOR_BUDGET_S))


def _is_name_list(value: Any) -> bool:
    return isinstance(value, Iterable) and all(isinstance(v, str) and v for v in value)


def adapter_module_names(model: nn.Module, spec: AdapterSpec) -> list[str]:
    """The full names of the linear modules ``spec``'s adapter attaches to (none for an empty
    ``target_modules`` beside ``target_parameters``)."""
    if spec.target_parameters and not spec.target_modules:
        return []
    return resolve_target_modules(
        model,
        spec.target_modules,
        spec.exclude_modules,
        spec.layers_to_transform,
        spec.layers_pattern,
    )


def resolve_target_parameters(model: nn.Module, spec: AdapterSpec) -> list[tuple[str, str]]:
    """``(module name, parameter name)`` of every expert weight ``spec.target_parameters``
    selects, matched as peft matches them: ``<module>.<parameter>`` equal to an entry or ending
    in ``.<entry>``.

    Raises:
        InvalidArgumentError: An entry matches no parameter, or matches one that is not an MoE
            expert weight (``gate_up_proj`` / ``down_proj`` of a transformers experts module).
    """
    if not spec.target_parameters:
        return []
    chosen, used = [], set()
    for name, module in model.named_modules():
        if _inside_lora(name):
            continue
        base = module.base_layer if isinstance(module, MultiLoraExperts) else module
        for param_name, _ in base.named_parameters(recurse=False):
            key = f"{name}.{param_name}"
            hits = [t for t in spec.target_parameters if key == t or key.endswith("." + t)]
            if not hits:
                continue
            if not (is_experts_module(base) and param_name in EXPERT_PARAMS):
                raise InvalidArgumentError(
                    f"adapter {spec.name!r}: target_parameters entry {hits[0]!r} selects {key!r}, "
                    f"which is not an MoE expert weight; Twinkle adapts only the "
                    f"{' and '.join(EXPERT_PARAMS)} of a mixture-of-experts block"
                )
            used.update(hits)
            chosen.append((name, param_name))
    missing = [t for t in spec.target_parameters if t not in used]
    if missing:
        raise InvalidArgumentError(
            f"adapter {spec.name!r}: target_parameters {missing!r} match no parameter of the "
            "model (name an MoE expert weight, e.g. 'mlp.experts.gate_up_proj')"
        )
    return chosen


def _layer_index(name: str, layers_pattern, budget: _Budget) -> int | None:
    # peft's rule: the first numbered segment (not a nested one such as an MoE expert index).
    if not layers_pattern:
        match = _FIRST_LAYER.match(name)
    else:
        match = None
        for pattern in layers_pattern:
            compiled = compile_selector("layers_pattern", rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.")
            match = bounded_match(compiled, name, budget, "layers_pattern", pattern)
            if match is not None:
                break
    return int(match["idx"]) if match else None


_FIRST_LAYER = re.compile(r".*?\.[^.]*\.(?P<idx>\d+)\.")


def _inside_lora(name: str) -> bool:
    parts = name.split(".")
    return "lora_A" in parts or "lora_B" in parts or parts[-1] == "base_layer"


def _adapter_seed(spec: AdapterSpec, module_name: str) -> int:
    return (spec.seed * 1_000_003 + zlib.crc32(module_name.encode())) % (2**63)


def inject_adapter(model: nn.Module, router: LoraRouter, spec: AdapterSpec) -> list[str]:
    """Add ``spec``'s adapter to its target linears (wrapping them on first use).

    Returns:
        The full names of the modules that carry the adapter.
    """
    names = adapter_module_names(model, spec)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        module = getattr(parent, child)
        if not isinstance(module, MultiLoraLinear):
            module.weight.requires_grad_(False)
            if module.bias is not None:
                module.bias.requires_grad_(False)
            scope = "vision" if is_vision_module(name) else "text"
            module = MultiLoraLinear(module, router, scope=scope)
            setattr(parent, child, module)
        generator = torch.Generator().manual_seed(_adapter_seed(spec, name))
        module.add_adapter(spec.for_module(name), generator)
    experts = resolve_target_parameters(model, spec)
    for name, param in experts:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        module = getattr(parent, child)
        if not isinstance(module, MultiLoraExperts):
            module = MultiLoraExperts(module, router)
            setattr(parent, child, module)
        key = f"{name}.{param}"
        local = spec.for_module(key)
        generator = torch.Generator().manual_seed(_adapter_seed(spec, key))
        module.add_adapter(spec, param, generator, rank=local.r, alpha=local.lora_alpha)
    return names + sorted({name for name, _ in experts})


def lora_layers(model: nn.Module) -> dict[str, MultiLoraLinear | MultiLoraExperts]:
    """Every adapter-carrying layer of ``model`` by module name: linears and expert blocks."""
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, (MultiLoraLinear, MultiLoraExperts))
    }


def layer_weights(layer: MultiLoraLinear | MultiLoraExperts, name: str) -> dict[str, nn.Parameter]:
    """Adapter ``name``'s weights in ``layer`` under their PEFT key suffixes (empty when the
    layer does not carry it)."""
    if isinstance(layer, MultiLoraExperts):
        return layer.adapter_weights(name)
    if name not in layer.lora_A:
        return {}
    return {"lora_A.weight": layer.lora_A[name].weight, "lora_B.weight": layer.lora_B[name].weight}


def remove_adapter(model: nn.Module, name: str) -> None:
    """Drop ``name``'s weights from every layer (wrapped layers stay; they cost nothing without adapters)."""
    for layer in lora_layers(model).values():
        layer.remove_adapter(name)


def adapter_parameters(model: nn.Module, name: str) -> list[nn.Parameter]:
    """The trainable parameters of one adapter, in a stable order."""
    params = []
    for layer in lora_layers(model).values():
        params.extend(layer_weights(layer, name).values())
    return params


def adapter_state_dict(model: nn.Module, name: str) -> dict[str, torch.Tensor]:
    """A CPU copy of ``name``'s weights under PEFT's saved keys
    (``base_model.model.<module>.lora_A.weight``): later training does not change it."""
    return {
        key: weight.detach().to("cpu", copy=True).contiguous()
        for key, weight in keyed_weights(model, name).items()
    }


def keyed_weights(model: nn.Module, name: str) -> dict[str, nn.Parameter]:
    """Adapter ``name``'s own parameters (not copies) under PEFT's saved keys."""
    return {
        f"{PEFT_PREFIX}{module_name}.{suffix}": weight
        for module_name, layer in lora_layers(model).items()
        for suffix, weight in layer_weights(layer, name).items()
    }


def load_adapter_state_dict(model: nn.Module, name: str, state: dict[str, torch.Tensor]) -> None:
    """Copy PEFT-keyed weights into adapter ``name``; every key must match in name and shape.

    Raises:
        ValueError: On missing or unexpected keys, or a shape mismatch (e.g. another rank or
            another base model).
    """
    expected = keyed_weights(model, name)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"adapter weights do not fit adapter {name!r}: "
            f"missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
            f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}"
        )
    with torch.no_grad():
        for key, value in state.items():
            target = expected[key]
            if tuple(target.shape) != tuple(value.shape):
                raise ValueError(
                    f"{key}: saved shape {tuple(value.shape)} != adapter shape {tuple(target.shape)}"
                )
            target.copy_(value.to(target.dtype))
