"""The optimizer side of the training step: gradient norms, clipping and optimizer steps over
one or many tenants, with shared multi-tensor kernels (:mod:`twinkle.model.multi_step`).

Functions take the tenants and callables for what stays the model's business (building an
optimizer, stepping a scheduler, the small-GEMM thread rule), never the model itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from twinkle.errors import InvalidArgumentError, StateOrderError
from twinkle.model import multi_step
from twinkle.model.flat import FlatAdapter
from twinkle.model.protocol import AdamParams
from twinkle.model.tenant import Tenant
from twinkle.model.threads import one_thread

SmallRule = Callable[[list[torch.Tensor]], bool]
"""Whether work on these tensors runs on one thread (``ExecutionOptions``' small-GEMM rule)."""


def clip_grad_norm(tenant: Tenant, max_grad_norm: float, small: SmallRule) -> float:
    """Clip the tenant's gradients to ``max_grad_norm``; returns the norm before clipping."""
    grads = tenant_grads(tenant)
    if not tenant.pending_grads or not grads:
        raise StateOrderError(
            f"adapter {tenant.name!r} has no gradients: call forward_backward first"
        )
    with one_thread(small(grads)):
        (norm,) = multi_step.clip_grad_norms([grads], max_grad_norm)
    tenant.last_grad_norm = norm
    return norm


def clip_grad_and_step_many(
    tenants: list[Tenant],
    max_grad_norm: float,
    *,
    ensure_optimizer: Callable[[Tenant], None],
    lr_step: Callable[[Tenant], None],
    small: SmallRule,
) -> dict[str, bool]:
    """``clip_grad_and_step`` for several tenants at once (see
    ``MultiLoraTransformersModel.clip_grad_and_step_many``)."""
    if len({t.name for t in tenants}) != len(tenants):
        raise InvalidArgumentError(f"adapter names repeat in {[t.name for t in tenants]!r}")
    grads_of: dict[str, list[torch.Tensor]] = {}
    for tenant in tenants:
        grads_of[tenant.name] = tenant_grads(tenant)  # checks the flat buffer's views once
        if not tenant.pending_grads or not grads_of[tenant.name]:
            raise StateOrderError(
                f"adapter {tenant.name!r} has no gradients: call forward_backward before step"
            )
    # Counted once the step went through: a failed batched step is rerun tenant by tenant, and
    # must not move anyone's accumulation window twice.
    stepping = [t for t in tenants if (t.micro_step + 1) % t.gradient_accumulation_steps == 0]
    for tenant in stepping:
        ensure_optimizer(tenant)
    grads = [grads_of[t.name] for t in stepping]
    # A tenant whose gradients are its flat buffer's views steps with the flat buffers.
    flats = [t.flat if is_flat(t, grads_of[t.name]) else None for t in stepping]
    with one_thread(small([g for tenant_grads in grads for g in tenant_grads])):
        norms = multi_step.clip_grad_norms(grads, max_grad_norm)
        multi_step.optimizer_steps([t.optimizer for t in stepping], flats)
    for tenant in tenants:
        tenant.micro_step += 1
    for tenant, norm, flat in zip(stepping, norms, flats):
        tenant.last_grad_norm = norm
        tenant.cur_step += 1
        discard_grads(tenant, flat)
        lr_step(tenant)
    stepped = {t.name for t in stepping}
    return {t.name: t.name in stepped for t in tenants}


def optim_step(
    tenant: Tenant, params: AdamParams, *, make_adamw: Callable[[Tenant, dict], None]
) -> dict[str, float]:
    """A Tinker-style step (see ``MultiLoraTransformersModel.optim_step``); ``make_adamw``
    gives the tenant an AdamW optimizer with the given constructor arguments."""
    if not tenant.pending_grads:
        raise StateOrderError(
            f"adapter {tenant.name!r}: optim_step without gradients: call forward_backward first"
        )
    hyper = params.optimizer_kwargs()
    if not isinstance(tenant.optimizer, torch.optim.AdamW):
        # Built with a positive rate (0 is refused at construction), then this call's rate.
        make_adamw(tenant, {**hyper, "lr": params.learning_rate or AdamParams().learning_rate})
    for group in tenant.optimizer.param_groups:
        group.update(hyper)
    # The same kernels as clip_grad_and_step: the flat buffers when every .grad is a view of
    # them (after a fused or data-parallel step the gradients live there).
    grads = tenant_grads(tenant)
    flat = tenant.flat if is_flat(tenant, grads) else None
    max_norm = params.grad_clip_norm if params.grad_clip_norm > 0 else float("inf")
    (norm,) = multi_step.clip_grad_norms([grads], max_norm) if grads else (0.0,)
    if params.learning_rate > 0 and grads:
        multi_step.optimizer_steps([tenant.optimizer], [flat])
    tenant.last_grad_norm = norm
    tenant.cur_step += 1
    discard_grads(tenant)
    return {
        "grad_norm": norm,
        "learning_rate": params.learning_rate,
        "step": float(tenant.cur_step),
    }


def discard_grads(tenant: Tenant, checked_flat: FlatAdapter | None = None) -> None:
    """``zero_grad``: zero the flat buffer in place when every ``.grad`` is its view (known
    already when ``checked_flat`` is given), else drop the gradients."""
    if checked_flat is not None:
        checked_flat.grad.zero_()
    elif tenant.flat is None or not tenant.flat.zero_grad():
        for param in tenant.params:
            param.grad = None
    tenant.pending_grads = False


def is_flat(tenant: Tenant, grads: list[torch.Tensor]) -> bool:
    """Whether ``grads`` (from :func:`tenant_grads`) is the tenant's flat gradient buffer."""
    return tenant.flat is not None and len(grads) == 1 and grads[0] is tenant.flat.grad


def tenant_grads(tenant: Tenant) -> list[torch.Tensor]:
    """The tenant's gradient tensors: its flat buffer when every ``.grad`` is a view of it."""
    if tenant.flat is not None and tenant.flat.owns_grads():
        return [tenant.flat.grad]
    return [p.grad for p in tenant.params if p.grad is not None]
