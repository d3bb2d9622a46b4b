"""Multi-LoRA: many tenants' adapters on one frozen base model, routed per row segment."""

from twinkle.model.lora.inject import (
    adapter_module_names,
    adapter_parameters,
    adapter_state_dict,
    inject_adapter,
    load_adapter_state_dict,
    remove_adapter,
    resolve_target_modules,
)
from twinkle.model.lora.layer import LoraRouter, MultiLoraLinear, RowRoute
from twinkle.model.lora.ops import segmented_lora, segmented_lora_reference
from twinkle.model.lora.segments import LoraSegment
from twinkle.model.lora.spec import AdapterSpec, adapter_spec_from_config, validate_adapter_name

__all__ = [
    "AdapterSpec",
    "LoraRouter",
    "LoraSegment",
    "MultiLoraLinear",
    "RowRoute",
    "adapter_module_names",
    "adapter_parameters",
    "adapter_spec_from_config",
    "adapter_state_dict",
    "inject_adapter",
    "load_adapter_state_dict",
    "remove_adapter",
    "resolve_target_modules",
    "segmented_lora",
    "segmented_lora_reference",
    "validate_adapter_name",
]
