"""Model operations the Tinker API needs beyond the native ones, registered into ``ops.OPS``.

- ``add_adapter_to_model`` with ``training_run_id``: the adapter of a Tinker training run, whose
  run id is the Tinker ``model_id`` (``<session>:train:<seq>``), with an AdamW optimizer.
- ``tinker_optim_step``: one AdamW step with the per-call ``AdamParams`` (learning rate, betas,
  eps, decoupled weight decay, gradient clipping).
- ``tinker_adapter_info``: rank, LoRA config and optimizer of the adapter.

Tinker's ``forward_backward`` needs no op of its own: the gateway sends the native, fusable
``forward_backward`` with features carrying ``target_tokens`` and a per-request ``loss``.
"""

from __future__ import annotations

import math
from typing import Any

from twinkle.server.errors import AtCapacity, BadRequest
from twinkle.server.model import ops as native_ops

_native_add_adapter = native_ops.OPS["add_adapter_to_model"]

DEFAULT_ADAM = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
}


def add_adapter_to_model(service, internal: str, entry, payload: dict[str, Any]):
    """The native op, or (with ``training_run_id``) a Tinker run with that exact run id."""
    run_id = payload.get("training_run_id")
    if run_id is None:
        return _native_add_adapter(service, internal, entry, payload)
    from twinkle.server.model.service import AdapterEntry

    owner, name = payload["_owner"], payload["_name"]
    if internal in service.adapters:
        raise BadRequest(f"model {name!r} already exists for this API key")
    if len(service.adapters) >= service.max_loras:
        raise AtCapacity(
            f"model {service.base_model} is at capacity (max_loras={service.max_loras})",
            retry_after=5.0,
        )
    config = dict(payload.get("config") or {})
    seed = config.pop("seed", None)
    kwargs = {} if seed is None else {"seed": int(seed)}
    service.model.add_adapter_to_model(internal, config, **kwargs)
    try:
        _set_adam(service.model, internal, DEFAULT_ADAM)
        _create_run(service, owner, run_id, payload, config)
    except Exception:
        service.model.remove_adapter(adapter_name=internal)
        raise
    rank = int(config.get("r", 8))
    now = service.clock()
    service.adapters[internal] = AdapterEntry(
        owner, name, internal, run_id, rank, payload.get("session_id"), now, now
    )
    service.unloaded.pop(internal, None)
    return {"adapter_name": name, "training_run_id": run_id}


def _create_run(
    service, owner: str, run_id: str, payload: dict[str, Any], config: dict[str, Any]
) -> None:
    state = getattr(service.registry, "state", None)
    if state is None:  # a process-local registry (tests): it names runs itself
        service.registry.runs[run_id] = {
            "owner": owner,
            "status": "active",
            "base_model": service.base_model,
            "lora_rank": int(config.get("r", 8)),
            "created_at": service.clock(),
        }
        return
    state.create_run(
        owner,
        payload["session_id"],
        service.base_model,
        int(config.get("r", 8)),
        model_seq_id=int(payload.get("model_seq_id", 0)),
        lora_config=native_ops.jsonable(config),
        user_metadata=payload.get("user_metadata") or {},
        training_run_id=run_id,
    )


def _set_adam(model, internal: str, params: dict[str, float]) -> Any:
    """Make the tenant's optimizer AdamW with ``params`` (kept state when it already is AdamW)."""
    import torch

    tenant = model._tenant(internal)
    hyper = {
        "lr": params["learning_rate"],
        "betas": (params["beta1"], params["beta2"]),
        "eps": params["eps"],
        "weight_decay": params["weight_decay"],
    }
    if not isinstance(tenant.optimizer, torch.optim.AdamW):
        model.set_optimizer("AdamW", adapter_name=internal, **hyper)
    for group in tenant.optimizer.param_groups:
        group.update(hyper)
    return tenant


def check_adam_params(params: dict[str, Any]) -> dict[str, float]:
    """``AdamParams`` with defaults filled in; refuses values Adam cannot use (a user error)."""
    merged = {
        **DEFAULT_ADAM,
        "grad_clip_norm": 0.0,
        **{k: v for k, v in params.items() if v is not None},
    }
    try:
        values = {k: float(merged[k]) for k in (*DEFAULT_ADAM, "grad_clip_norm")}
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"adam_params: not a number ({exc})") from None
    if not all(math.isfinite(v) for v in values.values()):
        raise BadRequest("adam_params must be finite numbers")
    if values["learning_rate"] < 0:
        raise BadRequest(f"learning_rate must be >= 0, got {values['learning_rate']}")
    if not (0 <= values["beta1"] < 1 and 0 <= values["beta2"] < 1):
        raise BadRequest("beta1 and beta2 must be in [0, 1)")
    if values["eps"] < 0 or values["weight_decay"] < 0 or values["grad_clip_norm"] < 0:
        raise BadRequest("eps, weight_decay and grad_clip_norm must be >= 0")
    return values


def tinker_optim_step(service, internal: str, entry, payload: dict[str, Any]):
    """Clip (when ``grad_clip_norm`` > 0), step AdamW with this call's hyper-parameters, zero grads."""
    import torch

    params = check_adam_params(payload.get("adam_params") or {})
    model = service.model
    tenant = model._tenant(internal)
    if not tenant.pending_grads:
        raise BadRequest("optim_step without gradients: call forward_backward first")
    _set_adam(model, internal, params)
    grads = [p for p in tenant.params if p.grad is not None]
    max_norm = params["grad_clip_norm"] if params["grad_clip_norm"] > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(grads, max_norm)) if grads else 0.0
    tenant.last_grad_norm = grad_norm
    if params["learning_rate"] > 0:
        tenant.optimizer.step()
    tenant.cur_step += 1
    model.zero_grad(adapter_name=internal)
    return {
        "metrics": {
            "grad_norm:mean": grad_norm,
            "learning_rate:mean": params["learning_rate"],
            "step:max": float(tenant.cur_step),
        }
    }


def tinker_adapter_info(service, internal: str, entry, payload: dict[str, Any]):
    configs = native_ops.jsonable(service.model.get_train_configs(adapter_name=internal))
    return {"lora": configs.get("lora"), "rank": entry.rank, "training_run_id": entry.run_id}


native_ops.OPS["add_adapter_to_model"] = add_adapter_to_model
native_ops.OPS["tinker_optim_step"] = tinker_optim_step
native_ops.OPS["tinker_adapter_info"] = tinker_adapter_info
