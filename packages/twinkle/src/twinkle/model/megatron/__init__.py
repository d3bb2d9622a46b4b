"""The megatron-core backend: one shared GPTModel, many tenants' LoRA adapters.

Importing this package does not import megatron-core; building a model does.
"""

from twinkle.model.megatron.multi_lora import MultiLoraMegatronModel

__all__ = ["MultiLoraMegatronModel"]
