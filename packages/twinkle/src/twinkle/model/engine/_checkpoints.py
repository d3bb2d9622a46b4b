"""Save, load and resume one tenant of a shared base model (the transformers and megatron
backends): each function takes the tenant and the base model, not the model class.

A backend whose process holds part of a tenant (a pipeline stage) hands these functions the
state to write and the way to read it back (``weights``, ``optimizer_state``, ``grads`` to
:func:`save`; ``load_state`` to :func:`load_weights`, and with ``read`` to :func:`resume`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from twinkle.env import TWINKLE_OUTPUT_DIR
from twinkle.errors import InvalidArgumentError, PathNotFoundError
from twinkle.model import checkpoint as ckpt
from twinkle.model.lora import adapter_module_names, adapter_state_dict, load_adapter_state_dict
from twinkle.model.step.optimizer import forget_gradients
from twinkle.model.tenant import Tenant


def _peft_config(tenant: Tenant, base_model: torch.nn.Module, model_dir: Any) -> dict[str, Any]:
    spec = tenant.spec
    config = {k: v for k, v in spec.peft_config.items() if _jsonable(v)}
    prefix_free = sorted({n.rsplit(".", 1)[-1] for n in adapter_module_names(base_model, spec)})
    config.update(
        peft_type="LORA",
        task_type="CAUSAL_LM",
        r=spec.r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.lora_dropout,
        use_rslora=spec.use_rslora,
        # Resolved names, so PEFT and vLLM attach to exactly the layers we trained.
        target_modules=prefix_free if spec.target_modules == "all-linear" else spec.target_modules,
        base_model_name_or_path=str(model_dir),
        inference_mode=True,
    )
    return config


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except TypeError:
        return False


def default_output_dir(tenant: Tenant) -> Path:
    return Path(TWINKLE_OUTPUT_DIR.get()) / tenant.name


def checkpoint_directory(
    tenant: Tenant, checkpoint: str | os.PathLike, save_dir: Path | None = None
) -> Path:
    """A checkpoint directory given as a path, or as a name under the tenant's output
    directory (``save_dir``, else the default: where ``save`` puts it without ``output_dir``)."""
    path = Path(checkpoint)
    if path.is_dir() or len(path.parts) != 1:
        return path
    parent = save_dir if save_dir is not None else default_output_dir(tenant)
    return parent / ckpt.validate_checkpoint_name(str(checkpoint))


PROGRESS_KEYS = ("cur_step", "consumed_train_samples", "micro_step", "adapter_name", "base_model")


def stored_progress(path: str | os.PathLike) -> dict[str, Any]:
    """The progress a checkpoint stores (``cur_step``, ``consumed_train_samples``, ...).

    Raises:
        PathNotFoundError: The checkpoint stores none.
    """
    directory = ckpt.require_checkpoint(path)
    state_path = directory / ckpt.TRAINER_STATE
    if not state_path.is_file():
        raise PathNotFoundError(f"{directory} has no {ckpt.TRAINER_STATE}: it stores no progress")
    progress = ckpt.read_json(state_path)
    return {key: progress[key] for key in PROGRESS_KEYS if key in progress}


def save(
    tenant: Tenant,
    base_model: torch.nn.Module,
    *,
    model_id: str,
    model_dir: str | os.PathLike,
    name: str,
    output_dir: str | os.PathLike | None = None,
    save_optimizer: bool = False,
    consumed_train_samples: int | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    grads: list[torch.Tensor | None] | None = None,
) -> str:
    """Write the tenant's adapter (PEFT layout) and, with ``save_optimizer``, its training state.

    Args:
        tenant: The tenant to save.
        base_model: The shared base model its adapter is injected into.
        model_id: The base model's id, stored to refuse resuming on another model.
        model_dir: The base model's directory, written as PEFT's ``base_model_name_or_path``.
        name: Checkpoint directory name (one plain path component).
        output_dir: Parent directory (``$TWINKLE_OUTPUT_DIR/<adapter>`` when ``None``).
        save_optimizer: Also write optimizer, scheduler, RNG and pending gradients.
        consumed_train_samples: Data progress to store instead of the tenant's own count.
        weights: The adapter state to write (default: the tenant's adapter on ``base_model``).
        optimizer_state: The optimizer state to write (default: the tenant's optimizer's).
        grads: The pending gradients to write (default: those of the tenant's parameters).

    Returns:
        The checkpoint directory path.
    """
    ckpt.validate_checkpoint_name(name)
    final = Path(output_dir) / name if output_dir is not None else default_output_dir(tenant) / name
    progress = {
        "adapter_name": tenant.name,
        "cur_step": tenant.cur_step,
        "micro_step": tenant.micro_step,
        "consumed_train_samples": (
            tenant.consumed_train_samples
            if consumed_train_samples is None
            else int(consumed_train_samples)
        ),
        "base_model": model_id,
        "has_optimizer": bool(save_optimizer and tenant.optimizer is not None),
        "train_configs": tenant.train_configs(model_id).model_dump(),
    }
    with ckpt.atomic_directory(final) as tmp:
        ckpt.write_json(tmp / ckpt.ADAPTER_CONFIG, _peft_config(tenant, base_model, model_dir))
        if weights is None:
            weights = adapter_state_dict(base_model, tenant.name)
        save_file(weights, str(tmp / ckpt.ADAPTER_WEIGHTS))
        ckpt.write_json(tmp / ckpt.TRAINER_STATE, progress)
        if progress["has_optimizer"]:
            if optimizer_state is None:
                optimizer_state = tenant.optimizer.state_dict()
            torch.save(optimizer_state, tmp / ckpt.OPTIMIZER_STATE)
            if tenant.scheduler is not None:
                torch.save(tenant.scheduler.state_dict(), tmp / ckpt.SCHEDULER_STATE)
            torch.save(ckpt.capture_rng_state(), tmp / ckpt.RNG_STATE)
            if tenant.pending_grads:
                if grads is None:
                    grads = [p.grad for p in tenant.params]
                torch.save(grads, tmp / ckpt.PENDING_GRADS)
    return str(final)


def load_weights(
    tenant: Tenant,
    base_model: torch.nn.Module,
    path: str | os.PathLike,
    load_state: Callable[[dict[str, torch.Tensor]], None] | None = None,
) -> None:
    """Load adapter weights only into the tenant's adapter on ``base_model``; gradients pending
    from before, the accumulation window and a kept forward are dropped (computed on the
    previous weights, they must not move the loaded ones).

    Args:
        load_state: Puts the checkpoint's whole adapter state into the tenant (default: into
            its adapter on ``base_model``; a pipeline stage keeps its own layers).

    Raises:
        ValueError: The checkpoint's rank differs from the adapter's, or it holds non-finite
            weights.
    """
    directory = ckpt.require_checkpoint(path)
    config_path = directory / ckpt.ADAPTER_CONFIG
    if config_path.is_file():
        saved_rank = ckpt.read_json(config_path).get("r")
        if saved_rank is not None and saved_rank != tenant.spec.r:
            raise ValueError(
                f"checkpoint {directory} has rank {saved_rank}, adapter {tenant.label!r} has rank {tenant.spec.r}"
            )
    state = load_file(str(directory / ckpt.ADAPTER_WEIGHTS))
    check_finite_weights(state)
    if load_state is None:
        load_adapter_state_dict(base_model, tenant.name, state)
    else:
        load_state(state)
    forget_gradients(tenant)


def read_state(file: Path) -> Any:
    """A torch-saved part of a checkpoint (optimizer, scheduler, RNG, pending gradients)."""
    return torch.load(file, weights_only=False)


def check_finite_weights(state: dict[str, torch.Tensor]) -> None:
    """Refuse adapter weights with a NaN or an infinity (nothing trains from them).

    Raises:
        InvalidArgumentError: Naming the first such tensor.
    """
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InvalidArgumentError(
                f"the checkpoint holds non-finite adapter weights ({key}): refused"
            )


def resume(
    tenant: Tenant,
    base_model: torch.nn.Module,
    model_id: str,
    path: str | os.PathLike,
    *,
    set_optimizer: Callable[..., None],
    set_lr_scheduler: Callable[..., None],
    load_state: Callable[[dict[str, torch.Tensor]], None] | None = None,
    read: Callable[[Path], Any] = read_state,
) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler, RNG and progress of the tenant.

    Args:
        tenant: The tenant to restore.
        base_model: The shared base model its adapter is injected into.
        model_id: This model's id; a checkpoint of another base model is refused.
        path: The checkpoint directory.
        set_optimizer: ``set_optimizer(name, **config)`` gives the tenant a new optimizer, for a
            tenant that has none yet (the backend's own rules apply, e.g. megatron's Adam only).
        set_lr_scheduler: ``set_lr_scheduler(name, **config)`` likewise for the scheduler.
        load_state: As for :func:`load_weights`.
        read: Reads one torch-saved file of the checkpoint (default :func:`read_state`); a
            process that holds part of the tenant's parameters returns its part of the
            optimizer state and pending gradients.

    Returns:
        The stored progress: ``cur_step``, ``consumed_train_samples``, ``micro_step``,
        ``adapter_name``, ``base_model``.
    """
    directory = ckpt.require_checkpoint(path)
    state_path = directory / ckpt.TRAINER_STATE
    if not state_path.is_file():
        raise FileNotFoundError(
            f"{directory} has no {ckpt.TRAINER_STATE}: it cannot be resumed (use load())"
        )
    progress = ckpt.read_json(state_path)
    if not progress.get("has_optimizer"):
        raise ValueError(
            f"{directory} was saved without optimizer state (save_optimizer=False): use load() for weights only"
        )
    if progress.get("base_model") not in (None, model_id):
        raise ValueError(
            f"{directory} was trained on {progress['base_model']}, this model is {model_id}"
        )
    load_weights(tenant, base_model, directory, load_state)
    if tenant.optimizer is None:
        configs = progress.get("train_configs", {}).get("optimizer") or {"name": "Adam"}
        configs = dict(configs)
        set_optimizer(configs.pop("name"), **configs)
    # Built before the optimizer state is loaded: a new scheduler resets the learning rate.
    scheduler_config = progress.get("train_configs", {}).get("lr_scheduler")
    if (
        tenant.scheduler is None
        and scheduler_config
        and (directory / ckpt.SCHEDULER_STATE).is_file()
    ):
        scheduler_config = dict(scheduler_config)
        set_lr_scheduler(scheduler_config.pop("name"), **scheduler_config)
    tenant.optimizer.load_state_dict(read(directory / ckpt.OPTIMIZER_STATE))
    if tenant.scheduler is not None and (directory / ckpt.SCHEDULER_STATE).is_file():
        tenant.scheduler.load_state_dict(read(directory / ckpt.SCHEDULER_STATE))
    ckpt.restore_rng_state(read(directory / ckpt.RNG_STATE))
    tenant.cur_step = int(progress["cur_step"])
    tenant.micro_step = int(progress.get("micro_step", 0))
    tenant.consumed_train_samples = int(progress["consumed_train_samples"])
    pending = directory / ckpt.PENDING_GRADS
    grads = read(pending) if pending.is_file() else [None] * len(tenant.params)
    for param, grad in zip(tenant.params, grads):
        param.grad = None if grad is None else grad.to(param.device)
    tenant.pending_grads = pending.is_file()
    return {
        k: progress[k]
        for k in ("cur_step", "consumed_train_samples", "micro_step", "adapter_name", "base_model")
    }
