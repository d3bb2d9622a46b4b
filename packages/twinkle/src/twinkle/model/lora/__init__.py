"""Multi-LoRA: many tenants' adapters on one frozen base model, routed per row segment."""

from twinkle.model.lora.experts import MultiLoraExperts
from twinkle.model.lora.inject import (
    adapter_module_names,
    adapter_parameters,
    adapter_state_dict,
    inject_adapter,
    load_adapter_state_dict,
    remove_adapter,
    resolve_target_modules,
    resolve_target_parameters,
)
from twinkle.model.lora.layer import LoraRouter, MultiLoraLinear, RowRoute
from twinkle.model.lora.ops import segmented_lora, segmented_lora_reference
from twinkle.model.lora.segments import LoraSegment
from twinkle.model.lora.spec import AdapterSpec, adapter_spec_from_config, validate_adapter_name

__all__ = [
    "AdapterSpec",
    "LoraRouter",
    "LoraSegment",
    "MultiLoraExperts",
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
    "resolve_target_parameters",
    "segmented_lora",
    "segmented_lora_reference",
    "validate_adapter_name",
]
