"""The Twinkle-native operations of the model deployment: one handler per model method.

Handlers run on the deployment's worker thread with ``(service, internal_name, entry, payload)``;
``payload`` holds the method's keyword arguments as JSON (plus ``_owner``/``_name``). Only names
travel over the wire (templates, losses, optimizers): no code is ever received from a client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from twinkle.server.errors import AtCapacity, BadRequest
from twinkle.server.state import validate_checkpoint_name

if TYPE_CHECKING:
    from twinkle.server.model.service import AdapterEntry, ModelService

_PRIVATE = ("_owner", "_name", "_why")
_LOSS_EXTRAS = ("advantages", "old_logprobs", "ref_logprobs", "weights")


def jsonable(value: Any) -> Any:
    """Numpy arrays and scalars -> lists and floats, recursively."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return value


def decode_inputs(inputs: Any) -> list[Any]:
    """Wire inputs -> what the model takes: features get numpy arrays, trajectories stay dicts."""
    if isinstance(inputs, dict):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("inputs must be a non-empty list of features or trajectories")
    decoded = []
    for i, item in enumerate(inputs):
        if not isinstance(item, dict):
            raise BadRequest(f"inputs[{i}] must be an object, got {type(item).__name__}")
        if "input_ids" in item:
            feature = {}
            for key, value in item.items():
                if isinstance(value, list):
                    try:
                        feature[key] = np.asarray(
                            value, dtype=np.float32 if key in _LOSS_EXTRAS else np.int64
                        )
                    except (TypeError, ValueError) as exc:
                        raise BadRequest(f"inputs[{i}].{key}: not a list of numbers") from exc
                else:
                    feature[key] = value
            if feature["input_ids"].ndim != 1 or not len(feature["input_ids"]):
                raise BadRequest(f"inputs[{i}].input_ids must be a non-empty list of token ids")
            decoded.append(feature)
        elif "messages" in item:
            decoded.append(item)
        else:
            raise BadRequest(f"inputs[{i}] has neither input_ids nor messages")
    return decoded


def count_tokens(payload: dict[str, Any]) -> int:
    inputs = payload.get("inputs")
    if not isinstance(inputs, list):
        return 0
    return sum(len(x.get("input_ids", ())) for x in inputs if isinstance(x, dict))


def check_lengths(payload: dict[str, Any], max_length: int) -> None:
    for i, item in enumerate(payload.get("inputs") or []):
        if isinstance(item, dict) and len(item.get("input_ids", ())) > max_length:
            raise BadRequest(
                f"inputs[{i}] has {len(item['input_ids'])} tokens, over the server's max_length={max_length}"
            )


def _kwargs(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k not in _PRIVATE}


def forward_backward_request(payload: dict[str, Any]) -> dict[str, Any]:
    request = _kwargs(payload)
    request["inputs"] = decode_inputs(request.get("inputs"))
    return request


def clip_grad_and_step_many(model: Any, tasks: list) -> dict[str, Any]:
    """Several tenants' ``clip_grad_and_step`` as one batched step (same ``max_grad_norm``).

    Raises (so the scheduler runs them one by one) when the backend has no batched step or the
    calls' arguments differ.
    """
    many = getattr(model, "clip_grad_and_step_many", None)
    kwargs = [_kwargs(task.payload) for task in tasks]
    if many is None or any(k != kwargs[0] for k in kwargs):
        raise ValueError("these clip_grad_and_step calls cannot be batched")
    return many([task.tenant for task in tasks], **kwargs[0])


def _only_names(kind: str, value: Any) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{kind} must be given by name over HTTP, got {type(value).__name__}")
    return value


# ---------------------------------------------------------------------------- handlers
def add_adapter_to_model(service: ModelService, internal: str, entry, payload):
    from twinkle.server.model.service import AdapterEntry

    owner, name = payload["_owner"], payload["_name"]
    if internal in service.adapters:
        raise BadRequest(f"adapter {name!r} already exists for this API key")
    if len(service.adapters) >= service.max_loras:
        raise AtCapacity(
            f"model {service.base_model} is at capacity (max_loras={service.max_loras})",
            retry_after=5.0,
        )
    config = payload.get("config") or {}
    if not isinstance(config, dict):
        raise BadRequest("config must be a LoRA config object (r, lora_alpha, target_modules, ...)")
    ga = payload.get("gradient_accumulation_steps", 1)
    service.model.add_adapter_to_model(internal, config, gradient_accumulation_steps=ga)
    run_id = service.registry.create_run(
        owner,
        adapter_name=name,
        base_model=service.base_model,
        lora_rank=int(config.get("r", 8)),
        lora_config=jsonable(config),
        session_id=payload.get("session_id"),
    )
    now = service.clock()
    service.adapters[internal] = AdapterEntry(
        owner, name, internal, run_id, int(config.get("r", 8)), payload.get("session_id"), now, now
    )
    service.unloaded.pop(internal, None)
    return {"adapter_name": name, "training_run_id": run_id}


def remove_adapter(service: ModelService, internal: str, entry: AdapterEntry, payload):
    service.model.remove_adapter(adapter_name=internal)
    del service.adapters[internal]
    why = payload.get("_why")
    service.unloaded[internal] = why or "removed by its owner"
    service.registry.set_run_status(entry.owner, entry.run_id, "unloaded" if why else "removed")
    return {"removed": entry.name}


def _setter(method: str, kind: str, names_only: bool = True) -> Callable:
    def handler(service: ModelService, internal: str, entry, payload):
        kwargs = _kwargs(payload)
        target = kwargs.pop(kind, None)
        if target is None:
            raise BadRequest(f"{method} needs {kind}=")
        getattr(service.model, method)(
            _only_names(kind, target) if names_only else target, adapter_name=internal, **kwargs
        )
        return {"ok": True}

    return handler


def _training(method: str) -> Callable:
    def handler(service: ModelService, internal: str, entry, payload):
        kwargs = _kwargs(payload)
        if "inputs" in kwargs:
            kwargs["inputs"] = decode_inputs(kwargs["inputs"])
        return jsonable(getattr(service.model, method)(adapter_name=internal, **kwargs))

    return handler


def calculate_metric(service, internal, entry, payload):
    return {
        "result": jsonable(
            service.model.calculate_metric(
                is_training=payload.get("is_training", True), adapter_name=internal
            ).result
        )
    }


def get_train_configs(service, internal, entry, payload):
    configs = jsonable(service.model.get_train_configs(adapter_name=internal))
    configs["adapter_name"], configs["model_id"] = entry.name, service.base_model
    configs["training_run_id"] = entry.run_id
    return configs


def save(service: ModelService, internal: str, entry: AdapterEntry, payload):
    name = validate_checkpoint_name(payload.get("name") or "")
    kind = "sampler_weights" if payload.get("kind") == "sampler" else "weights"
    target = service.registry.checkpoint_dir(entry.owner, entry.run_id, kind, name)
    service.model.save(
        name,
        output_dir=target.parent,
        save_optimizer=bool(payload.get("save_optimizer", False)),
        consumed_train_samples=payload.get("consumed_train_samples"),
        adapter_name=internal,
    )
    return {"path": service.registry.add_checkpoint(entry.owner, entry.run_id, kind, name)}


def _from_checkpoint(method: str) -> Callable:
    def handler(service: ModelService, internal: str, entry: AdapterEntry, payload):
        directory = service.registry.resolve_checkpoint(
            entry.owner, payload.get("path") or payload.get("checkpoint_dir") or ""
        )
        return jsonable(getattr(service.model, method)(str(directory), adapter_name=internal)) or {
            "ok": True
        }

    return handler


# Every handler returns plain JSON values (``jsonable`` where the model hands back numpy): the
# HTTP route sends them as they are.
OPS: dict[str, Callable] = {
    "add_adapter_to_model": add_adapter_to_model,
    "remove_adapter": remove_adapter,
    "set_template": _setter("set_template", "template"),
    "set_processor": _setter("set_processor", "processor"),
    "set_loss": _setter("set_loss", "loss"),
    "set_optimizer": _setter("set_optimizer", "optimizer"),
    "set_lr_scheduler": _setter("set_lr_scheduler", "scheduler"),
    "forward": _training("forward"),
    "forward_only": _training("forward_only"),
    "forward_backward": _training("forward_backward"),
    "calculate_loss": _training("calculate_loss"),
    "backward": _training("backward"),
    "clip_grad_norm": _training("clip_grad_norm"),
    "step": _training("step"),
    "zero_grad": _training("zero_grad"),
    "lr_step": _training("lr_step"),
    "clip_grad_and_step": _training("clip_grad_and_step"),
    "calculate_metric": calculate_metric,
    "get_train_configs": get_train_configs,
    "save": save,
    "load": _from_checkpoint("load"),
    "resume_from_checkpoint": _from_checkpoint("resume_from_checkpoint"),
}

from twinkle.server.model import tinker_ops  # noqa: E402,F401  - registers the Tinker API ops
