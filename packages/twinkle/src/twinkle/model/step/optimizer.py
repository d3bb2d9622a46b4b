"""The optimizer side of the training step: gradient norms, clipping and optimizer steps over
one or many tenants, with shared multi-tensor kernels (:mod:`twinkle.model.multi_step`).

Functions take the tenants and callables for what stays the model's business (building an
optimizer, stepping a scheduler, the small-GEMM thread rule), never the model itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch

from twinkle.errors import InvalidArgumentError, StateOrderError
from twinkle.model import multi_step, numerics
from twinkle.model.flat import FlatAdapter
from twinkle.model.protocol import AdamParams
from twinkle.model.tenant import Tenant
from twinkle.model.threads import one_thread

SmallRule = Callable[[list[torch.Tensor]], bool]
"""Whether work on these tensors runs on one thread (``ExecutionOptions``' small-GEMM rule)."""
Agreement = Callable[[bool], bool]
"""Pipeline stages' verdict on a step (:func:`twinkle.model.numerics.guarded_step`'s ``agree``)."""


def clip_grad_norm(tenant: Tenant, max_grad_norm: float, small: SmallRule) -> float:
    """Clip the tenant's gradients to ``max_grad_norm``; returns the norm before clipping."""
    grads = tenant_grads(tenant)
    if not tenant.pending_grads or not grads:
        raise StateOrderError(
            f"adapter {tenant.label!r} has no gradients: call forward_backward first"
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
    agree: Agreement | None = None,
) -> dict[str, bool]:
    """``clip_grad_and_step`` for several tenants at once (see
    ``MultiLoraTransformersModel.clip_grad_and_step_many``): all of them step, or (a weight
    would become non-finite) none does, each left as it was."""
    numerics.check_value("max_grad_norm", max_grad_norm)
    if len({t.name for t in tenants}) != len(tenants):
        raise InvalidArgumentError(f"adapter names repeat in {[t.name for t in tenants]!r}")
    grads_of: dict[str, list[torch.Tensor]] = {}
    for tenant in tenants:
        grads_of[tenant.name] = tenant_grads(tenant)  # checks the flat buffer's views once
        if not tenant.pending_grads or not grads_of[tenant.name]:
            raise StateOrderError(
                f"adapter {tenant.label!r} has no gradients: call forward_backward before step"
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
        norms = numerics.guarded_step(
            [t.name for t in stepping],
            take=lambda i: snapshot(stepping[i]),
            clip=lambda: multi_step.clip_grad_norms(grads, max_grad_norm),
            apply=lambda: multi_step.optimizer_steps([t.optimizer for t in stepping], flats),
            finite=lambda: weights_finite(stepping),
            agree=agree,
            hyper=", ".join(dict.fromkeys(hyper_text(t.optimizer) for t in stepping)),
        )
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
    tenant: Tenant,
    params: AdamParams,
    *,
    make_adamw: Callable[[Tenant, dict], None],
    agree: Agreement | None = None,
) -> dict[str, float]:
    """A Tinker-style step (see ``MultiLoraTransformersModel.optim_step``); ``make_adamw``
    gives the tenant an AdamW optimizer with the given constructor arguments. A step that would
    make a weight non-finite is refused and leaves the tenant as it was."""
    numerics.check_adam_params(params)
    if not tenant.pending_grads:
        raise StateOrderError(
            f"adapter {tenant.label!r}: optim_step without gradients: call forward_backward first"
        )
    # The same kernels as clip_grad_and_step: the flat buffers when every .grad is a view of
    # them (after a fused or data-parallel step the gradients live there).
    grads = tenant_grads(tenant)
    flat = tenant.flat if is_flat(tenant, grads) else None
    max_norm = params.grad_clip_norm if params.grad_clip_norm > 0 else float("inf")
    if params.learning_rate == 0 or not grads:
        # Nothing is applied: the norm is reported (whatever it is) and the gradients dropped.
        (norm,) = multi_step.clip_grad_norms([grads], max_norm) if grads else (0.0,)
    else:
        (norm,) = _adamw_step(tenant, params, grads, flat, max_norm, make_adamw, agree)
    tenant.last_grad_norm = norm
    tenant.cur_step += 1
    discard_grads(tenant)
    return {
        "grad_norm": norm,
        "learning_rate": params.learning_rate,
        "step": float(tenant.cur_step),
    }


def _adamw_step(tenant, params, grads, flat, max_norm, make_adamw, agree) -> list[float]:
    """Clip and step with THIS call's AdamW hyper-parameters, guarded; on a refusal the tenant
    keeps its previous optimizer object and hyper-parameters too."""
    previous = (tenant.optimizer, tenant.optimizer_config, tenant.scheduler)
    hyper = params.optimizer_kwargs()
    if not isinstance(tenant.optimizer, torch.optim.AdamW):
        make_adamw(tenant, hyper)
    groups = [dict(group) for group in tenant.optimizer.param_groups]
    for group in tenant.optimizer.param_groups:
        group.update(hyper)

    def take(_: int):
        restore_state = snapshot(tenant)

        def restore() -> None:
            restore_state()
            for group, saved in zip(tenant.optimizer.param_groups, groups):
                group.update({k: v for k, v in saved.items() if k != "params"})
            tenant.optimizer, tenant.optimizer_config, tenant.scheduler = previous

        return restore

    return numerics.guarded_step(
        [tenant.name],
        take=take,
        clip=lambda: multi_step.clip_grad_norms([grads], max_norm),
        apply=lambda: multi_step.optimizer_steps([tenant.optimizer], [flat]),
        finite=lambda: weights_finite([tenant]),
        agree=agree,
        hyper=hyper_text(tenant.optimizer),
    )


def plain_step(tenant: Tenant, agree: Agreement | None = None) -> None:
    """``optimizer.step()`` without clipping, guarded like every step."""
    grads = tenant_grads(tenant)
    numerics.guarded_step(
        [tenant.name],
        take=lambda _: snapshot(tenant),
        clip=lambda: multi_step.clip_grad_norms([grads], float("inf")) if grads else [0.0],
        apply=tenant.optimizer.step,
        finite=lambda: weights_finite([tenant]),
        agree=agree,
        hyper=hyper_text(tenant.optimizer),
    )


# ------------------------------------------------------------------------ the guard's torch half
def weight_tensors(tenant: Tenant) -> list[torch.Tensor]:
    """The tensors holding the tenant's weights: its flat buffer when every weight lives there."""
    if tenant.flat is not None and tenant.flat.intact():
        return [tenant.flat.param]
    return [p.detach() for p in tenant.params]


@torch.no_grad()
def snapshot(tenant: Tenant) -> Callable[[], None]:
    """A copy of what a step changes (weights, optimizer state, gradients); the returned
    callable puts it back in place. Adam state laid out in the tenant's flat buffers is copied
    as those three buffers; any other state is copied entry by entry and put back as a new
    state map (which a flat layout re-adopts, as after ``load_state_dict``)."""
    optimizer = tenant.optimizer
    tensors = weight_tensors(tenant) + tenant_grads(tenant)
    flat_state = _flat_state(tenant)
    if flat_state is not None:
        tensors += flat_state
    saved = [t.clone() for t in tensors]
    entries = None
    if optimizer is not None and flat_state is None:
        entries = {
            key: {k: v.clone() if torch.is_tensor(v) else v for k, v in entry.items()}
            for key, entry in optimizer.state.items()
        }

    @torch.no_grad()
    def restore() -> None:
        for tensor, copy in zip(tensors, saved):
            tensor.copy_(copy)
        if entries is not None:
            optimizer.state = defaultdict(dict, entries)

    return restore


def _flat_state(tenant: Tenant) -> list[torch.Tensor] | None:
    """The flat Adam buffers when every entry of the optimizer's state is a view of them."""
    flat, optimizer = tenant.flat, tenant.optimizer
    if flat is None or optimizer is None or not optimizer.state:
        return None
    buffers = [flat.exp_avg, flat.exp_avg_sq, flat.steps]
    if any(b is None for b in buffers):
        return None
    viewed = all(
        torch.is_tensor(v) and any(v._base is b for b in buffers)
        for entry in optimizer.state.values()
        for v in entry.values()
    )
    return buffers if viewed else None


@torch.no_grad()
def weights_finite(tenants: list[Tenant]) -> list[bool]:
    """Whether each tenant's weights are all finite: one reduction per tensor, one sync."""
    flags = [
        torch.stack([torch.isfinite(w).all() for w in weight_tensors(t)]).all() for t in tenants
    ]
    return [bool(f) for f in torch.stack(flags).tolist()] if flags else []


def hyper_text(optimizer: torch.optim.Optimizer | None) -> str:
    """The hyper-parameters that move weights, for a refusal's message."""
    if optimizer is None or not optimizer.param_groups:
        return ""
    group = optimizer.param_groups[0]
    names = ("lr", "weight_decay", "momentum")
    return ", ".join(f"{k} {group[k]:g}" for k in names if isinstance(group.get(k), (int, float)))


def forget_gradients(tenant: Tenant) -> None:
    """What a load does to the training in flight: pending gradients dropped, the accumulation
    window restarted, a kept forward forgotten (all were computed on the previous weights)."""
    discard_grads(tenant)
    tenant.micro_step = 0
    tenant.last_forward = None


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
