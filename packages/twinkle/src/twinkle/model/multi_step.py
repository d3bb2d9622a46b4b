"""One optimizer step for many tenants at once.

Stepping N tenants one after another costs N gradient-norm reductions, N clipping multiplies and
N Adam kernels, each with its Python and dispatch overhead; with many small adapters that overhead
rivals the arithmetic. Here the whole set is handled with a few multi-tensor kernels over all the
tenants' tensors: one norm kernel, one clip multiply, and one fused Adam kernel per distinct set of
hyper-parameters. A tenant whose adapter lives in flat buffers (:mod:`twinkle.model.flat`) enters
those kernels as ONE tensor (its whole gradient, weights and Adam moments) instead of one per weight.

Nothing is shared but the arithmetic: every tenant keeps its own optimizer object and state (so
checkpoints and ``state_dict`` are unchanged), its own clipping coefficient and its own step count.
The results equal those of each tenant's own ``clip_grad_norm_`` + ``optimizer.step()``
(``tests/twinkle/model/test_multi_step.py``). Optimizers that cannot be batched (SGD, custom classes,
several parameter groups, step hooks, non-fused Adam) take their own ``step()``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from twinkle.model import torch_compat

if TYPE_CHECKING:
    from twinkle.model.flat import FlatAdapter

_BATCHABLE = (torch.optim.Adam, torch.optim.AdamW)


def clip_grad_norms(grad_lists: list[list[torch.Tensor]], max_norm: float) -> list[float]:
    """Clip each list of gradients to ``max_norm`` by its OWN total L2 norm; returns the norms.

    Same arithmetic as ``torch.nn.utils.clip_grad_norm_`` applied to each list separately: per
    tensor norms, their 2-norm per list, coefficient ``min(1, max_norm / (norm + 1e-6))``.
    """
    flat = [g for grads in grad_lists for g in grads]
    if not flat:
        return [0.0 for _ in grad_lists]
    per_tensor = torch.stack(list(torch_compat.foreach_norm(flat)))
    if per_tensor.dtype != torch.float32:
        per_tensor = per_tensor.float()
    counts = [len(grads) for grads in grad_lists]
    owner = torch.repeat_interleave(
        torch.arange(len(counts), device=per_tensor.device),
        torch.tensor(counts, device=per_tensor.device),
    )
    totals = torch.zeros(len(counts), device=per_tensor.device)
    totals = totals.index_add_(0, owner, per_tensor.square()).sqrt()
    # float32 arithmetic as torch's: the exact same coefficients, then one multiply over every
    # tensor, each by its own list's coefficient (1.0 = not clipped).
    coefs = torch.clamp(max_norm / (totals + 1e-6), max=1.0).tolist()
    torch_compat.foreach_mul_(flat, [c for c, n in zip(coefs, counts) for _ in range(n)])
    return totals.tolist()


def _batch_key(optimizer: torch.optim.Optimizer) -> tuple | None:
    """The hyper-parameters a shared fused Adam kernel needs equal, or None if not batchable."""
    if type(optimizer) not in _BATCHABLE or len(optimizer.param_groups) != 1:
        return None
    if torch_compat.adam_functional is None or torch_compat.optimizer_has_step_hooks(optimizer):
        return None
    if getattr(optimizer, "grad_scale", None) is not None:
        return None
    group = optimizer.param_groups[0]
    if not group.get("fused") or group.get("capturable") or group.get("differentiable"):
        return None
    if any(torch.is_tensor(group[k]) for k in ("lr", "weight_decay", "eps")):
        return None
    beta1, beta2 = group["betas"]
    if torch.is_tensor(beta1) or torch.is_tensor(beta2):
        return None
    return (
        bool(group.get("decoupled_weight_decay", False)),
        bool(group["amsgrad"]),
        bool(group["maximize"]),
        float(group["lr"]),
        float(beta1),
        float(beta2),
        float(group["weight_decay"]),
        float(group["eps"]),
    )


def _global_hooks() -> bool:
    from torch.optim import optimizer as torch_optimizer

    return bool(
        torch_optimizer._global_optimizer_pre_hooks or torch_optimizer._global_optimizer_post_hooks
    )


def optimizer_steps(
    optimizers: list[torch.optim.Optimizer],
    flats: list[FlatAdapter | None] | None = None,
) -> int:
    """``step()`` every optimizer; batchable Adam/AdamW ones share fused kernels.

    Args:
        optimizers: One per tenant.
        flats: Each tenant's :class:`~twinkle.model.flat.FlatAdapter`, given only where the
            caller has checked that every weight's ``.grad`` is a view of its buffer (else None):
            such a tenant enters the shared kernel as one tensor instead of one per weight (and
            does so even when it steps alone).

    Returns:
        The number of fused kernel launches shared by several optimizers (for tests and metrics).
    """
    groups: dict[tuple, list[tuple[torch.optim.Optimizer, FlatAdapter | None]]] = defaultdict(list)
    hooked = _global_hooks()  # global step hooks must see every optimizer's own step()
    for optimizer, flat in zip(optimizers, flats or [None] * len(optimizers)):
        key = None if hooked else _batch_key(optimizer)
        if key is None:
            optimizer.step()
        else:
            groups[key].append((optimizer, flat))
    for key, members in groups.items():
        if len(members) == 1 and members[0][1] is None:
            members[0][0].step()
            continue
        _fused_adam_step(key, members)
    return sum(1 for members in groups.values() if len(members) > 1)


@torch.no_grad()
def _fused_adam_step(
    key: tuple, members: list[tuple[torch.optim.Optimizer, FlatAdapter | None]]
) -> None:
    decoupled, amsgrad, maximize, lr, beta1, beta2, weight_decay, eps = key
    lists: tuple[list[torch.Tensor], ...] = ([], [], [], [], [], [])
    has_complex = False
    flat_members = []
    for optimizer, flat in members:
        buffers = (
            flat.adam_buffers(optimizer, grads_checked=True)
            if flat is not None and not amsgrad
            else None
        )
        if buffers is None:
            # The optimizer's own lazy state initialisation, so its state is exactly what its
            # own step() would have created.
            has_complex |= optimizer._init_group(optimizer.param_groups[0], *lists)
        else:
            param, grad, exp_avg, exp_avg_sq, step = buffers
            for target, value in zip(lists, (param, grad, exp_avg, exp_avg_sq)):
                target.append(value)
            lists[5].append(step)
            flat_members.append(flat)
    torch_compat.adam_functional(
        *lists,
        fused=True,
        has_complex=has_complex,
        decoupled_weight_decay=decoupled,
        amsgrad=amsgrad,
        beta1=beta1,
        beta2=beta2,
        lr=lr,
        weight_decay=weight_decay,
        eps=eps,
        maximize=maximize,
    )
    for flat in flat_members:
        flat.sync_steps()
    for optimizer, _ in members:
        # What the lr scheduler's step() wrapper records; keeps its order check quiet.
        optimizer._opt_called = True  # type: ignore[attr-defined]
