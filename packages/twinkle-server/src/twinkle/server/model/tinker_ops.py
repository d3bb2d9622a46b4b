"""The model operations the Tinker API needs beyond the native ones (:func:`tinker_operations`).

- ``tinker_optim_step``: the backend's ``optim_step`` with the call's ``AdamParams`` (learning
  rate, betas, eps, decoupled weight decay, gradient clipping). Every backend implements it
  (``twinkle.model.protocol.TrainingModel``); nothing here touches torch.
- ``tinker_adapter_info``: rank, LoRA config and run id of the adapter.

A Tinker training run is created by the native ``add_adapter_to_model`` with a
``training_run_id``; Tinker's ``forward_backward`` is the native, fusable ``forward_backward`` with
features carrying ``target_tokens`` and a per-request ``loss``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twinkle.model import numerics
from twinkle.model.protocol import AdamParams
from twinkle.server.model.operations import optim_step
from twinkle.server.model.protocol import Call, Empty, Operation, OperationTable, OptimStep
from twinkle.server.model.tinker_weights_ops import weights_operations
from twinkle.server.web.encoding import finite_json, jsonable
from twinkle.server.web.errors import BadRequest


def check_adam_params(params: Any) -> dict[str, float]:
    """``AdamParams`` with defaults filled in, as a dict; a value Adam cannot use, or one
    outside its range (``twinkle.model.numerics.RANGES``: ``learning_rate`` in [0, 10], ...),
    is a 400 naming the field and the range."""
    try:
        adam = AdamParams.coerce(params)
        numerics.check_adam_params(adam, where="")
    except ValueError as exc:  # InvalidArgumentError
        raise BadRequest(f"adam_params: {exc}") from None
    return dataclasses.asdict(adam)


def tinker_optim_step(service: Any, call: Call, request: OptimStep) -> dict[str, Any]:
    """The native ``optim_step``, its metrics named as Tinker reports them (a non-finite
    gradient norm, reported by a step at learning rate 0, as ``"NaN"``: see ``encoding``)."""
    result = optim_step(service, call, request)
    metrics = {
        "grad_norm:mean": float(result["grad_norm"]),
        "learning_rate:mean": float(result["learning_rate"]),
        "step:max": float(result["step"]),
    }
    return {"metrics": finite_json(metrics)}


def tinker_adapter_info(service: Any, call: Call, request: Empty) -> dict[str, Any]:
    entry = service.entry(call)
    configs = jsonable(service.model.get_train_configs(adapter_name=call.internal))
    return {"lora": configs.get("lora"), "rank": entry.rank, "training_run_id": entry.run_id}


def tinker_operations() -> OperationTable:
    """The Tinker-only operations, to add to the native table of a model deployment."""
    return (
        OperationTable(
            [
                Operation("tinker_optim_step", OptimStep, tinker_optim_step, steps=True),
                Operation("tinker_adapter_info", Empty, tinker_adapter_info),
            ]
        )
        + weights_operations()
    )


__all__ = ["check_adam_params", "tinker_operations"]
