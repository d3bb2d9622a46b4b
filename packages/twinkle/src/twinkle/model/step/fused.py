"""The fused training step: several tenants' batches through one base-model pass, each tenant's
own loss on its own rows, one backward into every tenant's adapter gradients."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from twinkle.errors import InvalidArgumentError
from twinkle.model import torch_compat
from twinkle.model.lora import LoraRouter
from twinkle.model.memory import release_above
from twinkle.model.options import ExecutionOptions
from twinkle.model.step.batch import TenantBatch
from twinkle.model.step.loss import compute_loss, loss_of, public_output, record_train_metrics
from twinkle.model.step.optimizer import weights_finite
from twinkle.model.step.passes import ForwardState, forward_batches, linear_head
from twinkle.model.step.plan import (
    ModelShape,
    Piece,
    can_split,
    head_chunk_bytes,
    memory_limit_bytes,
    pass_token_budget,
    plan_passes,
    refuse_unfit,
    rows_of,
    split_to_fit,
)
from twinkle.model.tenant import Tenant


def fused_forward_backward(
    base_model: torch.nn.Module,
    router: LoraRouter,
    device: torch.device,
    batches: Sequence[TenantBatch],
    tenants: Sequence[Tenant],
    *,
    direct_weight_grads: bool,
    options: ExecutionOptions | None = None,
    recompute: Any = None,
    agree: Callable[[BaseException | None], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Forward, loss and backward of every batch, in as few base-model passes as the token
    budget allows.

    Args:
        base_model: The shared base model, adapters injected.
        router: The router of the base model's multi-LoRA layers.
        device: Where the base model runs.
        batches: One collated batch per tenant (at least one).
        tenants: ``tenants[i]`` owns ``batches[i]``.
        direct_weight_grads: Let the LoRA layers add their weight gradients straight into the
            tenants' flat gradient buffers where that gives what autograd would (see
            ``LoraRouter.direct_weight_grads``); ``False`` always leaves it to autograd.
        options: The model's ``ExecutionOptions`` (``None``: the defaults). From it:
            ``max_pass_tokens``, the most padded tokens one pass holds (``None``: the device's
            default, ``0``: every batch in one pass); whole batches are packed into passes
            (:func:`~twinkle.model.step.plan.plan_passes`). ``split_batches``: a batch over the
            budget runs as row chunks (else whole, alone): a no-grad pass per chunk gives its
            full log-probs, its loss's gradient with respect to them is taken on the whole
            batch, and a pass per chunk backpropagates that gradient, so any loss (sequence-level,
            grouped, paired) gets exactly the gradient of one pass, at one extra forward.
            ``activation_recompute``: ``on`` recomputes the decoder layers in every pass,
            ``auto`` in a pass over the budget; ``linear_logprobs`` and the chunk sizes: how
            log-probs are taken (:mod:`~twinkle.model.step.passes`).
        recompute: The model's decoder-layer recompute switch
            (:class:`~twinkle.model.transformers.recompute.LayerRecompute`); ``None``: the model
            has none, and passes never recompute.
        agree: Called before each whole pass's backward with this process's failure of its
            forward or loss (``None``: none), by ranks whose backward passes must pair up
            (megatron expert parallel): it raises when any rank failed, so either every rank
            runs the backward or none does (``None``: a failure raises at once).

    Returns:
        ``{tenant name: {'loss', 'logprobs', 'num_tokens', 'metrics'}}``. Each tenant's ``.grad``
        gains the gradient of ``loss / gradient_accumulation_steps``, as a pass of its own would
        give it. A loss that fails leaves every ``.grad`` as it was.

    Raises:
        InvalidArgumentError: No batch, or a batch whose smallest pass (a row where rows may be
            cut, else the batch) cannot fit the device's memory even with recompute; raised
            before any pass runs.
    """
    if not batches:
        raise InvalidArgumentError("forward_backward_many needs at least one request")
    options = options or ExecutionOptions()
    direct = _direct_grads_ok(tenants, direct_weight_grads)
    losses = [loss_of(batch, tenant) for batch, tenant in zip(batches, tenants)]
    splittable = [
        options.split_batches and can_split(b, t.spec.lora_dropout if t.spec is not None else 0.0)
        for b, t in zip(batches, tenants)
    ]
    mode = options.activation_recompute if recompute is not None else "off"
    logits_free = options.linear_logprobs and linear_head(base_model) is not None
    budget = pass_token_budget(
        options.max_pass_tokens,
        base_model,
        device,
        logits_free=logits_free,
        recompute=mode == "on",
    )
    # Per-token entropies only for a step where an attached metric reads them.
    entropies = any(_wants_entropies(t) for t in tenants)
    shape = ModelShape.of(base_model)
    fit = dict(
        logits_free=logits_free,
        recompute=mode != "off",
        fixed_bytes=head_chunk_bytes(options.linear_chunk_bytes, shape.dtype_bytes)
        if logits_free
        else 0,
        # the device's own budget fits by construction; a configured one is the user's word
        budget=budget if options.max_pass_tokens is None else None,
    )
    # Read once per step, and only when a batch is over the pass budget.
    limit = functools.cache(functools.partial(memory_limit_bytes, device, options.memory_budget_mb))
    if budget is not None:
        # A batch too large for memory runs as row chunks even where the options keep batches
        # whole: the alternative is a pass that cannot run (or takes the replica's memory).
        cuttable = [
            can_split(b, t.spec.lora_dropout if t.spec is not None else 0.0)
            for b, t in zip(batches, tenants)
        ]
        splittable = split_to_fit(batches, splittable, cuttable, shape, limit, **fit)
    refuse_unfit(
        batches,
        [s or b.num_samples == 1 for s, b in zip(splittable, batches)],
        shape,
        limit,
        budget_mb=options.memory_budget_mb,
        **fit,
    )
    # Packed in layout order (see _layout_key): same-rank tenants share passes and sit side by
    # side in them, and similar lengths pad less.
    order = sorted(range(len(batches)), key=lambda i: _layout_key(batches[i], tenants[i]))
    plan = [
        [Piece(order[p.index], p.start, p.stop, p.whole) for p in pieces]
        for pieces in plan_passes(
            [batches[i] for i in order], budget, [splittable[i] for i in order]
        )
    ]
    direct_ctx = router.direct_weight_grads if direct else nullcontext
    states: list[Any] = [None] * len(batches)
    saved = None
    try:
        for pieces in plan:
            over = budget is not None and _pass_tokens(batches, pieces) > budget
            on = mode == "on" or (mode == "auto" and over)
            ctx = functools.partial(_pass_context, direct_ctx, recompute, on)

            if pieces[0].whole:
                failure = None
                try:
                    total = _whole_pass(
                        base_model,
                        router,
                        device,
                        batches,
                        tenants,
                        losses,
                        pieces,
                        states,
                        ctx,
                        options,
                        entropies,
                    )
                except Exception as exc:
                    if agree is None:
                        raise
                    failure = exc
                if agree is not None:
                    agree(failure)  # raises when any rank failed
                if failure is not None:
                    raise failure
            else:
                i = pieces[0].index
                if states[i] is not None:
                    continue  # every chunk of this batch ran with its first piece
                chunks = [p for p in plan if p[0].index == i and not p[0].whole]
                states[i], total, backward = _split_loss(
                    base_model,
                    router,
                    device,
                    batches[i],
                    tenants[i],
                    losses[i],
                    [c[0] for c in chunks],
                    options,
                    ctx,
                    entropies,
                )
            # Attached here, not before the first forward, so that a request that fails
            # before any backward leaves .grad untouched; a direct pass found them attached.
            if saved is None:
                if not direct:
                    attach_grads(tenants)
                saved = _save_grads(tenants)
            if pieces[0].whole:
                total.backward()
                _drop_graph([states[p.index] for p in pieces])
            else:
                backward()
            del total
    except BaseException:
        # A backward that fails half way (out of memory, a loss's own backward, a later pass's
        # loss) has added some gradients already: put every tenant's back, so that the caller's
        # rerun of each tenant alone adds its gradient exactly once.
        if saved is not None:
            _restore_grads(tenants, saved)
        raise
    for state, tenant in zip(states, tenants):
        record_train_metrics(tenant, state)
    release_above(options.memory_budget_mb)
    return {state.batch.tenant: public_output(state) for state in states}


def _pass_tokens(batches: Sequence[TenantBatch], pieces: Sequence[Piece]) -> int:
    """Padded tokens of a pass: its rows times its longest sequence."""
    rows = sum(p.stop - p.start for p in pieces)
    return rows * max(batches[p.index].tensors["input_ids"].shape[1] for p in pieces)


@contextmanager
def _pass_context(direct_ctx: Callable[[], Any], recompute: Any, on: bool):
    """A pass's forward context: direct weight gradients (when the step uses them) and, when
    ``on``, decoder-layer recompute."""
    with direct_ctx(), recompute.enabled(True) if recompute is not None and on else nullcontext():
        yield


def _whole_pass(
    base_model, router, device, batches, tenants, losses, pieces, states, ctx, options, entropies
) -> torch.Tensor:
    """Forward and loss of the whole batches of one pass (their states into ``states``); the
    total to backpropagate, refused when not finite."""
    idx = [p.index for p in pieces]
    with ctx():
        done = forward_batches(
            base_model,
            router,
            device,
            [batches[i] for i in idx],
            [losses[i] for i in idx],
            grad=True,
            options=options,
            entropies=entropies,
        )
    total = None
    for state, i in zip(done, idx):
        compute_loss(state, losses[i])
        scaled = state.loss_output.loss / tenants[i].gradient_accumulation_steps
        total = scaled if total is None else total + scaled
        states[i] = state
    _refuse_non_finite(total, done, [tenants[i] for i in idx])
    return total


def _split_loss(
    base_model: torch.nn.Module,
    router: LoraRouter,
    device: torch.device,
    batch: TenantBatch,
    tenant: Tenant,
    loss: Any,
    chunks: Sequence[Piece],
    options: ExecutionOptions,
    ctx: Any,
    entropies: bool,
) -> tuple[ForwardState, torch.Tensor, Any]:
    """One batch too large for a pass: its loss on the whole batch from no-grad chunk passes,
    and a ``backward()`` that reruns each chunk with gradients and backpropagates the loss's
    gradient with respect to that chunk's log-probs (exact for any loss of the log-probs)."""
    parts = [rows_of(batch, c.start, c.stop) for c in chunks]
    with torch.no_grad():
        done = [
            forward_batches(
                base_model,
                router,
                device,
                [p],
                [loss],
                grad=False,
                options=options,
                entropies=entropies,
            )[0]
            for p in parts
        ]
    state = ForwardState(batch)
    state.logprobs = torch.cat([d.logprobs for d in done]).requires_grad_(True)
    if done[0].ref_logprobs is not None:
        state.ref_logprobs = torch.cat([d.ref_logprobs for d in done])
    state.correct = sum(d.correct for d in done)
    if entropies:
        state.entropies = torch.cat([d.entropies for d in done])
    with torch.enable_grad():
        compute_loss(state, loss)
        total = state.loss_output.loss / tenant.gradient_accumulation_steps
    _refuse_non_finite(total, [state], [tenant])
    (grad,) = torch.autograd.grad(total, state.logprobs)
    state.logprobs = state.logprobs.detach()

    def backward() -> None:
        for chunk, part in zip(chunks, parts):
            with ctx():
                (again,) = forward_batches(
                    base_model, router, device, [part], [None], grad=True, options=options
                )
            (again.logprobs * grad[chunk.start : chunk.stop]).sum().backward()

    return state, total, backward


def _wants_entropies(tenant: Tenant) -> bool:
    attached = getattr(tenant, "attached_metrics", None)
    return attached is not None and attached.wants_entropies(True)


def _drop_graph(states: Sequence[ForwardState]) -> None:
    """After a pass's backward: its states keep values only, not the autograd graph.

    The backward frees the graph's saved tensors, but its nodes (thousands of small allocations
    made during the forward, in between the activations) live as long as a tensor refers to
    them. Left until the step's end they split the freed activation memory into pieces the next
    pass's tensors do not fit, and the heap grows pass by pass (docs/performance.md, "Memory per
    pass")."""
    for state in states:
        state.logprobs = state.logprobs.detach()
        state.loss_output.loss = state.loss_output.loss.detach()


def _refuse_non_finite(
    total: torch.Tensor, states: Sequence[Any], tenants: Sequence[Tenant]
) -> None:
    """Refuse the pass before the backward when a loss is NaN or infinite: that tenant's
    gradients would be NaN (and its next step would ruin its weights), and its request must fail
    while nothing has changed. One check of the sum; the tenants are named only when it fails,
    with the cause: adapter weights that are not finite (a load or an outside change; steps
    never make them so), else the loss inputs."""
    if bool(torch.isfinite(total.detach())):
        return
    bad = [(s, t) for s, t in zip(states, tenants) if not bool(torch.isfinite(s.loss_output.loss))]
    weights_ok = weights_finite([t for _, t in bad])
    causes = [
        f"{s.batch.tenant!r} ({float(s.loss_output.loss.detach())}"
        + ("" if ok else ": its adapter weights are not finite; load a checkpoint")
        + ")"
        for (s, _), ok in zip(bad, weights_ok)
    ]
    inputs = (
        "" if not all(weights_ok) else " (check the loss inputs: advantages, weights, logprobs)"
    )
    raise InvalidArgumentError(
        f"loss is not finite for adapter {', '.join(causes)}; nothing was applied{inputs}"
    )


def _save_grads(tenants: Sequence[Tenant]) -> list[list[torch.Tensor] | None]:
    """What each tenant's gradients are before a backward: ``None`` when it has none pending
    (restored by zeroing, with no copy), else a copy (only mid gradient-accumulation)."""
    saved: list[list[torch.Tensor] | None] = []
    for tenant in tenants:
        if not tenant.pending_grads:
            saved.append(None)
        elif tenant.flat is not None and tenant.flat.owns_grads():
            saved.append([tenant.flat.grad.clone()])
        else:
            saved.append([p.grad.clone() if p.grad is not None else None for p in tenant.params])
    return saved


@torch.no_grad()
def _restore_grads(tenants: Sequence[Tenant], saved: list[list[torch.Tensor] | None]) -> None:
    for tenant, grads in zip(tenants, saved):
        owns = tenant.flat is not None and tenant.flat.owns_grads()
        if grads is None:
            if owns:
                tenant.flat.grad.zero_()
            else:
                for param in tenant.params:
                    param.grad = None
        elif owns and len(grads) == 1:
            tenant.flat.grad.copy_(grads[0])
        else:
            for param, grad in zip(tenant.params, grads):
                param.grad = grad


def attach_grads(tenants: Sequence[Tenant]) -> None:
    """Before a backward: gradients accumulate into each tenant's flat buffer (``flat.py``)."""
    for tenant in tenants:
        if tenant.flat is not None:
            tenant.flat.attach_grads()


def _layout_key(batch: TenantBatch, tenant: Tenant) -> tuple:
    """Where a batch's rows go in a pass: tenants of one rank, row count and length side by side.

    The torch multi-LoRA kernel runs consecutive segments of the same rank and row count as one
    ``bmm`` per stage instead of one ``mm`` each (``lora/torch_kernel.py``), so 32 tenants of
    ranks cycling 8/16/32 become three groups instead of 32 segments. Each row's result does not
    depend on its place in the pass (sorted() is stable: equal keys keep their order).
    """
    rank = tenant.spec.r if tenant.spec is not None else 0
    return (rank, batch.num_samples, batch.tensors["input_ids"].shape[1])


def _direct_grads_ok(tenants: Sequence[Tenant], enabled: bool) -> bool:
    """Whether the step may use ``direct_weight_grads``: it is ``enabled``, every tenant's
    ``.grad`` already is its flat buffer (attached at its first backward and kept by
    ``zero_grad``), and no adapter weight is frozen or carries a gradient hook (which only
    autograd's ``AccumulateGrad`` would run)."""
    return enabled and all(
        tenant.flat is not None
        and tenant.flat.owns_grads()
        and not any(
            not p.requires_grad or torch_compat.param_has_grad_hooks(p) for p in tenant.params
        )
        for tenant in tenants
    )


__all__ = ["attach_grads", "fused_forward_backward"]
