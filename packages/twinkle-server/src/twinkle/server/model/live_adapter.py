"""The model side of sampling from a live adapter: its tensors copied out of memory, no checkpoint.

``adapter_tensors`` runs in the tenant's queue (so after every earlier training call of that
adapter) and returns the adapter's PEFT config with a CPU copy of its weights as tensors. It is
``internal``: the gateway calls it in process or through a Ray handle (which ships the tensors as
binary buffers) and hands the result to the sampler; the model's HTTP routes do not serve it,
because tensors are not JSON. ``tinker_adapter_state`` is the JSON twin (base64 safetensors).
"""

from __future__ import annotations

from typing import Any

from twinkle.model.protocol import capabilities_of
from twinkle.server.model.protocol import Call, Empty, Operation, OperationTable
from twinkle.server.web.errors import BadRequest


def adapter_tensors(service: Any, call: Call, request: Empty) -> dict[str, Any]:
    """The live adapter of ``call``: its PEFT config, its weights (CPU tensors) and its step."""
    model = service.model
    capabilities = capabilities_of(model)
    if not capabilities.adapter_state_io:
        raise BadRequest("sampling from the live adapter needs the transformers backend")
    # A tensor-parallel megatron model keeps its tenants in its rank processes (no ``tenant``
    # here, so no step to read); rank 0 holds every adapter whole.
    step = int(model.tenant(call.internal).cur_step) if capabilities.local_tenants else None
    import torch

    # CPU tensors: the sampler reads them on its own thread while this model trains on (the
    # transformers model's copy already is one; a data-parallel wrapper's may be arrays).
    tensors = {
        k: v.detach().to("cpu") if isinstance(v, torch.Tensor) else torch.as_tensor(v)
        for k, v in model.adapter_state_dict(call.internal).items()
    }
    return {"config": model.adapter_peft_config(call.internal), "tensors": tensors, "step": step}


def live_adapter_operations() -> OperationTable:
    return OperationTable([Operation("adapter_tensors", Empty, adapter_tensors, internal=True)])


__all__ = ["adapter_tensors", "live_adapter_operations"]
