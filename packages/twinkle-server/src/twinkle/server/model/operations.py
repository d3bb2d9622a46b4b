"""The Twinkle-native model operations: one handler per model method, registered in
:func:`native_operations`.

Handlers run on the deployment's worker thread as ``handler(service, call, request)`` with the
validated request of :mod:`twinkle.server.model.protocol`, and return plain JSON values.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from twinkle.model.checkpoint import TRAINER_STATE
from twinkle.model.protocol import AdamParams
from twinkle.server.images import check_request_images
from twinkle.server.model import protocol as p
from twinkle.server.model.adapter_upload import upload_adapter
from twinkle.server.model.host import ModelHost
from twinkle.server.model.protocol import Call, Operation, OperationTable
from twinkle.server.state import validate_checkpoint_name
from twinkle.server.state.records import EPHEMERAL_PREFIX, RESERVED_NAME
from twinkle.server.web.encoding import jsonable
from twinkle.server.web.errors import BadRequest, NotFound
from twinkle_client.processor.base import CONVERSATION_KEYS

logger = logging.getLogger("twinkle.server.model")

PROGRESS_KEYS = ("cur_step", "consumed_train_samples", "micro_step", "adapter_name", "base_model")
DEFAULT_HUB_ENDPOINT = "https://www.modelscope.cn"
_LOSS_EXTRAS = ("advantages", "old_logprobs", "ref_logprobs", "weights")
_FLOAT_KEYS = (*_LOSS_EXTRAS, "pixel_values")


def decode_inputs(inputs: Any) -> list[Any]:
    """Wire inputs -> what the model takes: features get numpy arrays, trajectories stay dicts.
    Images are checked first (``twinkle.server.images``): a bad one is a 400, nothing runs."""
    if isinstance(inputs, dict):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("inputs must be a non-empty list of features or trajectories")
    check_request_images(inputs)
    decoded = []
    for i, item in enumerate(inputs):
        if not isinstance(item, dict):
            raise BadRequest(f"inputs[{i}] must be an object, got {type(item).__name__}")
        if "input_ids" in item:
            decoded.append(_decode_feature(i, item))
        elif "messages" in item:
            decoded.append(item)
        else:
            raise BadRequest(f"inputs[{i}] has neither input_ids nor messages")
    return decoded


# A sampled sequence's ``new_input_feature`` carries its conversation and the row's data beside
# its ids: passed on as they are (the collate leaves them out), never decoded as numbers.
_PASSTHROUGH_KEYS = frozenset(CONVERSATION_KEYS)


def _decode_feature(i: int, item: dict[str, Any]) -> dict[str, Any]:
    feature = {}
    for key, value in item.items():
        if key in _PASSTHROUGH_KEYS:
            feature[key] = value
        elif isinstance(value, list):
            try:
                feature[key] = np.asarray(
                    value, dtype=np.float32 if key in _FLOAT_KEYS else np.int64
                )
            except (TypeError, ValueError, OverflowError) as exc:
                raise BadRequest(f"inputs[{i}].{key}: not a list of numbers") from exc
        else:
            feature[key] = value
    ids = feature["input_ids"]
    if not isinstance(ids, np.ndarray) or ids.ndim != 1 or not len(ids):
        raise BadRequest(f"inputs[{i}].input_ids must be a non-empty list of token ids")
    return feature


def count_tokens(request: Any) -> int:
    """Input tokens of a training request (0 for any other request)."""
    inputs = getattr(request, "inputs", None)
    if isinstance(inputs, dict):
        inputs = [inputs]
    if not isinstance(inputs, list):
        return 0
    return sum(len(x.get("input_ids", ())) for x in inputs if isinstance(x, dict))


def check_lengths(request: Any, max_length: int) -> None:
    inputs = getattr(request, "inputs", None)
    for i, item in enumerate(inputs if isinstance(inputs, list) else [inputs]):
        if isinstance(item, dict) and len(item.get("input_ids", ())) > max_length:
            raise BadRequest(
                f"inputs[{i}] has {len(item['input_ids'])} tokens, over the server's max_length={max_length}"
            )


def training_kwargs(request: p.Training) -> dict[str, Any]:
    """A training request as the backend method's keyword arguments, inputs decoded."""
    kwargs = request.kwargs()
    kwargs["inputs"] = decode_inputs(kwargs["inputs"])
    return kwargs


# ---------------------------------------------------------------------------- handlers
def add_adapter_to_model(service: ModelHost, call: Call, request: p.AddAdapter):
    """A new adapter and its training run; a Tinker run (``training_run_id``) keeps that exact
    run id, may carry an init ``seed`` in its config and trains with AdamW (``optim_step``)."""
    config = dict(request.config)
    kwargs: dict[str, Any] = {"gradient_accumulation_steps": request.gradient_accumulation_steps}
    tinker_run = request.training_run_id is not None
    if tinker_run and config.get("seed") is not None:
        kwargs["seed"] = int(config.pop("seed"))
    # The model holds the adapter under the private internal id; its messages show the
    # tenant's own name.
    service.model.add_adapter_to_model(call.internal, config, display_name=call.name, **kwargs)
    try:
        if tinker_run:
            service.model.set_optimizer(
                "AdamW", adapter_name=call.internal, **AdamParams().optimizer_kwargs()
            )
        run_id = service.registry.create_run(
            call.owner,
            adapter_name=call.name,
            base_model=service.base_model,
            lora_rank=request.rank,
            lora_config=jsonable(config),
            session_id=request.session_id,
            training_run_id=request.training_run_id,
            model_seq_id=request.model_seq_id,
            user_metadata=request.user_metadata,
            limit=service.per_token_model_limit,
        )
    except Exception:
        service.model.remove_adapter(adapter_name=call.internal)
        raise
    service.adapter_added(call, run_id, request.rank, request.session_id, config)
    return {"adapter_name": call.name, "training_run_id": run_id}


def remove_adapter(service: ModelHost, call: Call, request: p.Empty):
    entry = service.entry(call)
    service.model.remove_adapter(adapter_name=call.internal)
    service.adapter_removed(call, entry)
    return {"removed": entry.name}


def _setter(method: str, field: str) -> Callable:
    def handler(service: ModelHost, call: Call, request: p.OpenRequest):
        kwargs = request.kwargs()
        getattr(service.model, method)(kwargs.pop(field), adapter_name=call.internal, **kwargs)
        return {"ok": True}

    return handler


def _training(method: str) -> Callable:
    def handler(service: ModelHost, call: Call, request: p.Training):
        kwargs = training_kwargs(request)
        return jsonable(getattr(service.model, method)(adapter_name=call.internal, **kwargs))

    return handler


def _method(method: str) -> Callable:
    """A backend method called with the request's fields as keyword arguments."""

    def handler(service: ModelHost, call: Call, request: p.Request):
        return jsonable(
            getattr(service.model, method)(adapter_name=call.internal, **request.kwargs())
        )

    return handler


def calculate_metric(service: ModelHost, call: Call, request: p.CalculateMetric):
    metric = service.model.calculate_metric(
        is_training=request.is_training, adapter_name=call.internal
    )
    return {"result": jsonable(metric.result)}


def get_train_configs(service: ModelHost, call: Call, request: p.Empty):
    entry = service.entry(call)
    configs = jsonable(service.model.get_train_configs(adapter_name=call.internal))
    configs["adapter_name"], configs["model_id"] = entry.name, service.base_model
    configs["training_run_id"] = entry.run_id
    return configs


class TenantSave(p.Save):
    """``save`` as a tenant calls it: the reserved snapshot prefix is refused up front (a
    sampler checkpoint so named would be swept as an unnamed snapshot)."""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name.startswith(EPHEMERAL_PREFIX):
            raise ValueError(RESERVED_NAME)
        return name


class RouteSave(p.Save):
    """The save a gateway route makes for a tenant (the Tinker saves): any name the route
    chose (its snapshots included), registered with ``ttl_seconds`` in the same record."""

    ttl_seconds: float | None = Field(None, gt=0)


def save(service: ModelHost, call: Call, request: TenantSave):
    return _save(service, call, request)


def save_checkpoint(service: ModelHost, call: Call, request: RouteSave):
    return _save(service, call, request, request.ttl_seconds)


def _save(service: ModelHost, call: Call, request: p.Save, ttl_s: float | None = None):
    entry = service.entry(call)
    name = validate_checkpoint_name(request.name)
    kind = "sampler_weights" if request.for_sampler else "weights"
    target = service.registry.checkpoint_dir(entry.owner, entry.run_id, kind, name)
    service.model.save(
        name,
        output_dir=target.parent,
        save_optimizer=request.save_optimizer,
        consumed_train_samples=request.consumed_train_samples,
        adapter_name=call.internal,
    )
    path = service.registry.add_checkpoint(entry.owner, entry.run_id, kind, name, ttl_s)
    return {"path": path}


class DeleteCheckpoint(p.Request):
    run_id: str
    kind: str
    name: str
    only_expired: bool = False


def delete_checkpoint(service: ModelHost, call: Call, request: DeleteCheckpoint):
    """Delete one of the caller's checkpoints (record and files) in the queue of the adapter
    that saves it: after every save of it queued before, before every one queued after, so a
    save and a delete of one name never interleave. With ``only_expired`` (the sweeper), only
    if it is still expired when its turn comes."""
    path = service.registry.delete_checkpoint(
        call.owner, request.run_id, request.kind, request.name, request.only_expired
    )
    return {"deleted": path}


def load(service: ModelHost, call: Call, request: p.FromCheckpoint):
    """Weights only; with ``load_optimizer``, the whole training state (``resume``'s work)."""
    directory = str(service.registry.resolve_checkpoint(call.owner, request.target))
    if request.resume_only_model:
        raise BadRequest("load: resume_only_model belongs to resume_from_checkpoint")
    if request.load_optimizer:
        service.model.resume_from_checkpoint(directory, adapter_name=call.internal)
    else:
        service.model.load(directory, adapter_name=call.internal)
    return {"ok": True}


def resume_from_checkpoint(service: ModelHost, call: Call, request: p.FromCheckpoint):
    """Everything back; with ``resume_only_model``, the weights and the stored progress only."""
    directory = str(service.registry.resolve_checkpoint(call.owner, request.target))
    if not request.resume_only_model:
        result = service.model.resume_from_checkpoint(directory, adapter_name=call.internal)
        return jsonable(result) or {"ok": True}
    service.model.load(directory, adapter_name=call.internal)
    return stored_progress(directory)


def stored_progress(directory: str) -> dict[str, Any]:
    """The progress a checkpoint stores (``cur_step``, ``consumed_train_samples``, ...).

    Raises:
        BadRequest: The checkpoint stores none (a sampler checkpoint).
    """
    state = Path(directory) / TRAINER_STATE
    if not state.is_file():
        raise BadRequest("this checkpoint stores no training progress (a sampler checkpoint?)")
    saved = json.loads(state.read_text(encoding="utf-8"))
    return {key: saved[key] for key in PROGRESS_KEYS if key in saved}


def get_state_dict(service: ModelHost, call: Call, request: p.Empty):
    """The adapter's weights as ``{key: {"shape": [...], "data": [flat float32 values]}}``."""
    method = getattr(service.model, "get_state_dict", None)
    if method is None:
        raise BadRequest(
            f"this server's {type(service.model).__name__} backend has no get_state_dict"
        )
    state = method(adapter_name=call.internal)
    wire = {}
    for key, tensor in state.items():
        values = np.asarray(tensor.float().cpu() if hasattr(tensor, "cpu") else tensor)
        values = values.astype(np.float32)
        wire[key] = {"shape": list(values.shape), "data": values.ravel().tolist()}
    return wire


def add_metric(service: ModelHost, call: Call, request: p.AddMetric):
    method = getattr(service.model, "add_metric", None)
    if method is None:
        raise BadRequest(f"this server's {type(service.model).__name__} backend has no add_metric")
    kwargs = request.kwargs()
    method(kwargs.pop("metric_cls"), adapter_name=call.internal, **kwargs)
    return {"ok": True}


def upload_to_hub(service: ModelHost, call: Call, request: p.UploadToHub):
    """Start uploading one of the caller's own checkpoints (never a published one of another
    tenant) to the hub in the background; returns the upload's status (``upload_status``).

    The token is the request's ``hub_token``, else the one
    :meth:`~twinkle.server.hub.HubPublisher.token_for` picks. Everything that can be checked
    at once is, before anything starts: the checkpoint, the token, that the hub answers."""
    from twinkle.hub.upload import adapter_files, check_reachable
    from twinkle.hub.upload import upload_to_hub as start_upload
    from twinkle.server.hub import HubToken

    directory = service.registry.resolve_checkpoint(
        call.owner, request.checkpoint_dir, allow_public=False
    )
    adapter_files(directory)
    if request.hub_token:
        token = HubToken(request.hub_token.strip(), "request")
        check_reachable(_hub_endpoint(service.hub.endpoint))
    else:
        token = service.hub.token_for(call.presented_key)  # asks the hub: fails if unreachable
    future = start_upload(
        directory,
        request.hub_model_id,
        token=token.token,
        async_upload=True,
        endpoint=service.hub.endpoint,
        private=service.hub.private if request.private is None else request.private,
        commit_message=request.commit_message,
    )
    future.add_done_callback(lambda f: _log_upload(request.hub_model_id, f))
    return service.uploads.start(call.owner, request.hub_model_id, future, token=token.source)


def upload_status(service: ModelHost, call: Call, request: p.UploadStatus):
    status = service.uploads.status(call.owner, request.upload_id)
    if status is None:
        raise NotFound(f"no upload {request.upload_id!r} of this API key on this model server")
    return status


def _hub_endpoint(configured: str | None) -> str:
    from twinkle.server.env import MODELSCOPE_ENDPOINT

    return configured or MODELSCOPE_ENDPOINT.get() or DEFAULT_HUB_ENDPOINT


def _log_upload(hub_model_id: str, future: Any) -> None:
    error = future.exception()
    if error is None:
        logger.info("uploaded to the hub: %s", hub_model_id)
    else:
        logger.warning("upload to the hub failed: %s: %s", hub_model_id, error)


def capacity_info(service: ModelHost, call: Call, request: p.Empty):
    """Adapter slots of this model: ``max_loras`` on the device, ``used_loras`` taken."""
    used = len(service.adapters)
    return {
        "max_loras": service.max_loras,
        "used_loras": used,
        "free_loras": max(0, service.max_loras - used),
    }


def optim_step(service: ModelHost, call: Call, request: p.OptimStep):
    """The backend's Tinker-style ``optim_step`` with this call's Adam parameters."""
    try:
        params = AdamParams.coerce(request.adam_params)
    except ValueError as exc:
        raise BadRequest(f"adam_params: {exc}") from None
    return jsonable(service.model.optim_step(params, adapter_name=call.internal))


def clip_grad_and_step_many(service: ModelHost, calls: list[Call], requests: list) -> dict:
    """Several tenants' ``clip_grad_and_step`` as one batched step (same ``max_grad_norm``)."""
    norms = {r.max_grad_norm for r in requests}
    if len(norms) != 1:
        raise ValueError("these clip_grad_and_step calls cannot be batched")
    return service.model.clip_grad_and_step_many([c.internal for c in calls], norms.pop())


def native_operations() -> OperationTable:
    """Every Twinkle-native operation of the model deployment."""
    op = Operation
    return OperationTable(
        [
            op("add_adapter_to_model", p.AddAdapter, add_adapter_to_model, creates_adapter=True),
            op("remove_adapter", p.Empty, remove_adapter),
            op("set_template", p.SetTemplate, _setter("set_template", "template")),
            op("set_processor", p.SetProcessor, _setter("set_processor", "processor")),
            op("set_loss", p.SetLoss, _setter("set_loss", "loss")),
            op("set_optimizer", p.SetOptimizer, _setter("set_optimizer", "optimizer")),
            op("set_lr_scheduler", p.SetLrScheduler, _setter("set_lr_scheduler", "scheduler")),
            op("forward", p.Training, _training("forward"), trains=True),
            op("forward_only", p.Training, _training("forward_only")),
            op("forward_backward", p.Training, _training("forward_backward"), trains=True),
            op("calculate_loss", p.CalculateLoss, _method("calculate_loss")),
            op("backward", p.Empty, _method("backward")),
            op("clip_grad_norm", p.MaxGradNorm, _method("clip_grad_norm")),
            op("step", p.Empty, _method("step"), steps=True),
            op("zero_grad", p.Empty, _method("zero_grad")),
            op("lr_step", p.Empty, _method("lr_step")),
            op("clip_grad_and_step", p.MaxGradNorm, _method("clip_grad_and_step"), steps=True),
            op("optim_step", p.OptimStep, optim_step, steps=True),
            op("calculate_metric", p.CalculateMetric, calculate_metric),
            op("get_train_configs", p.Empty, get_train_configs),
            op("save", TenantSave, save),
            op("save_checkpoint", RouteSave, save_checkpoint, internal=True),
            op("delete_checkpoint", DeleteCheckpoint, delete_checkpoint, internal=True),
            op("load", p.FromCheckpoint, load),
            op("upload_adapter", p.UploadAdapter, upload_adapter),
            op("resume_from_checkpoint", p.FromCheckpoint, resume_from_checkpoint),
            op("get_state_dict", p.Empty, get_state_dict),
            op("add_metric", p.AddMetric, add_metric),
            op(
                "upload_to_hub",
                p.UploadToHub,
                upload_to_hub,
                off_queue=True,
                uses_caller_key=True,
            ),
            op("upload_status", p.UploadStatus, upload_status, off_queue=True),
            op("capacity_info", p.Empty, capacity_info, off_queue=True),
        ]
    )


__all__ = [
    "check_lengths",
    "count_tokens",
    "decode_inputs",
    "native_operations",
    "training_kwargs",
]
