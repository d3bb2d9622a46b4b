"""The training step itself: collate a tenant's inputs, run the base model once for one or many
tenants, apply each tenant's own loss to its own rows, backpropagate once."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from twinkle.errors import InvalidArgumentError
from twinkle.model.lora import RowRoute
from twinkle.model.metrics import MetricAccumulator
from twinkle.model.tenant import Tenant
from twinkle.model.transformers.batch import (
    IGNORE_INDEX,
    PER_TOKEN_KEYS,
    as_float_tensor,
    is_collated,
    shift_left,
    split_inputs,
    token_logprobs,
)

if TYPE_CHECKING:
    from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel

_PAD_VALUES = {"input_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX, "position_ids": 0}


@dataclass
class ForwardState:
    """One tenant's micro-batch through one forward pass."""

    tenant: str
    tensors: dict[str, torch.Tensor]
    targets: torch.Tensor
    mask: torch.Tensor
    extras: dict[str, torch.Tensor | None]
    logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    correct: int = 0
    loss_output: Any = None
    num_samples: int = 0
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    loss: Any = None


def collate(
    model: MultiLoraTransformersModel, tenant: Tenant, inputs: Any, kwargs: dict[str, Any]
) -> ForwardState:
    """Turn the tenant's inputs into padded tensors, shifted targets and loss extras."""
    if is_collated(inputs):
        tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    else:
        items, needs_template = split_inputs(inputs)
        template = model._template(tenant)
        features = template.batch_encode(items) if needs_template else items
        _check_lengths(tenant, template, features)
        tensors = model._processor(tenant)(features)
    input_ids = tensors["input_ids"]
    vocab = model.model.get_input_embeddings().weight.shape[0]
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
        raise InvalidArgumentError(f"input_ids out of the vocabulary range [0, {vocab})")
    if "labels" not in tensors and "target_tokens" not in tensors:
        raise InvalidArgumentError(
            "inputs carry no labels: encode them with a template or pass labels"
        )
    rows, seq = input_ids.shape
    # Tinker-style inputs carry ``target_tokens`` already aligned with the positions (the target
    # AT position t): no shift, for the targets and for the per-token extras alike.
    aligned = "target_tokens" in tensors
    extras = {}
    for key in PER_TOKEN_KEYS:
        value = kwargs.pop(key, None)
        if value is None and key in tensors and key not in _PAD_VALUES:
            value = tensors[key]
        if value is not None:
            value = (
                _aligned_float(value, rows, seq, key)
                if aligned
                else as_float_tensor(value, rows, seq, key)
            )
        extras[key] = value
    targets = (
        _aligned_targets(tensors, vocab) if aligned else shift_left(tensors["labels"], IGNORE_INDEX)
    )
    loss = kwargs.pop("loss", None)
    return ForwardState(
        tenant=tenant.name,
        tensors={k: tensors[k] for k in _PAD_VALUES if k in tensors},
        targets=targets,
        mask=(targets != IGNORE_INDEX).float(),
        extras=extras,
        num_samples=rows,
        loss_kwargs=kwargs,
        loss=None if loss is None else _request_loss(loss),
    )


def _aligned_targets(tensors: dict[str, torch.Tensor], vocab: int) -> torch.Tensor:
    """``target_tokens`` as targets, -100 on padding; refuses ids outside the vocabulary."""
    targets = tensors["target_tokens"].long().clone()
    if "attention_mask" in tensors:
        targets[tensors["attention_mask"] == 0] = IGNORE_INDEX
    real = targets[targets != IGNORE_INDEX]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab):
        raise InvalidArgumentError(f"target_tokens out of the vocabulary range [0, {vocab})")
    return targets


def _aligned_float(value: Any, rows: int, seq: int, name: str) -> torch.Tensor:
    """A per-row or per-token value already aligned with ``target_tokens`` (zero-padded, not shifted)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if all(np.ndim(v) == 0 for v in value):
        return as_float_tensor(value, rows, seq, name)
    if len(value) != rows:
        raise InvalidArgumentError(f"{name}: {len(value)} rows of values for {rows} rows of inputs")
    out = torch.zeros(rows, seq, dtype=torch.float32)
    for i, row in enumerate(value):
        row = np.asarray(row, dtype=np.float32).reshape(-1)
        if row.shape[0] > seq:
            raise InvalidArgumentError(
                f"{name}: row {i} has {row.shape[0]} values, longer than its {seq} tokens"
            )
        out[i, : row.shape[0]] = torch.from_numpy(row)
    return out


def _request_loss(spec: Any) -> Any:
    """A per-request loss: a name, ``{'name': ..., **config}`` or a Loss instance."""
    from twinkle.loss import get_loss

    if isinstance(spec, dict):
        config = dict(spec)
        return get_loss(config.pop("name"), **config)
    return get_loss(spec)


def _check_lengths(tenant: Tenant, template: Any, features: list[Any]) -> None:
    limit = getattr(template, "max_length", None)
    if not limit:
        return
    for i, feature in enumerate(features):
        length = len(feature["input_ids"])
        if length > limit:
            raise InvalidArgumentError(
                f"adapter {tenant.name!r}: sample {i} has {length} tokens, over max_length={limit}"
            )


def _pad_to(tensor: torch.Tensor, seq: int, value: float | int) -> torch.Tensor:
    if tensor.shape[1] == seq:
        return tensor
    pad = tensor.new_full((tensor.shape[0], seq - tensor.shape[1], *tensor.shape[2:]), value)
    return torch.cat([tensor, pad], dim=1)


def run_base(
    model: MultiLoraTransformersModel, states: list[ForwardState], routes: list[RowRoute] | None
) -> torch.Tensor:
    """One forward over the rows of ``states`` stacked (right-padded to a common length)."""
    seq = max(s.tensors["input_ids"].shape[1] for s in states)
    batch = {}
    for key, pad in _PAD_VALUES.items():
        if all(key in s.tensors for s in states):
            batch[key] = torch.cat([_pad_to(s.tensors[key], seq, pad) for s in states]).to(
                model.device
            )
    batch.pop("labels", None)
    with model.router.route(routes or []):
        return model.model(**batch, use_cache=False).logits


def _attach_logprobs(states: list[ForwardState], logits: torch.Tensor, attr: str) -> None:
    """Log-probs of every state's targets, from one pass over the stacked logits.

    One cross-entropy and one argmax over all rows: slicing the logits per tenant first would make
    backward zero-fill a full-size logits gradient once per tenant.
    """
    seq = logits.shape[1]
    targets = torch.cat([_pad_to(s.targets, seq, IGNORE_INDEX) for s in states]).to(logits.device)
    logprobs = token_logprobs(logits, targets)
    row_hits = None
    if attr == "logprobs":
        # Correct predictions per row, for every state at once (padding targets never count).
        hits = (logits.detach().argmax(-1) == targets) & (targets != IGNORE_INDEX)
        row_hits = hits.sum(-1).tolist()
    row = 0
    for state in states:
        rows, state_seq = state.targets.shape
        setattr(state, attr, logprobs[row : row + rows, :state_seq])
        if row_hits is not None:
            state.correct = sum(row_hits[row : row + rows])
        row += rows


def forward_states(
    model: MultiLoraTransformersModel, states: list[ForwardState], grad: bool
) -> None:
    """Fill each state's log-probs (one fused pass) and, where its loss wants them, reference log-probs."""
    routes, row = [], 0
    for state in states:
        routes.append(RowRoute(state.tenant, row, row + state.num_samples))
        row += state.num_samples
    with torch.set_grad_enabled(grad):
        _attach_logprobs(states, run_base(model, states, routes), "logprobs")
    needing_ref = [
        s
        for s in states
        if getattr(s.loss or model.tenants[s.tenant].loss, "needs_reference", False)
    ]
    if needing_ref:
        with torch.no_grad():
            _attach_logprobs(needing_ref, run_base(model, needing_ref, routes=None), "ref_logprobs")


def forward(model, tenant: Tenant, inputs: Any, kwargs: dict[str, Any], grad: bool) -> ForwardState:
    state = collate(model, tenant, inputs, dict(kwargs))
    forward_states(model, [state], grad)
    return state


def compute_loss(model, tenant: Tenant, state: ForwardState, kwargs: dict[str, Any]) -> None:
    from twinkle.loss import LossInputs

    device = state.logprobs.device
    extras = {k: (v.to(device) if v is not None else None) for k, v in state.extras.items()}
    ref = extras.pop("ref_logprobs")
    inputs = LossInputs(
        logprobs=state.logprobs,
        mask=state.mask.to(device),
        target_tokens=state.targets.to(device),
        advantages=extras["advantages"],
        old_logprobs=extras["old_logprobs"],
        ref_logprobs=ref if ref is not None else state.ref_logprobs,
        weights=extras["weights"],
        extra=dict(state.loss_kwargs),
    )
    state.loss_output = (state.loss or tenant.loss)(inputs)


def fused_forward_backward(model, requests: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """See ``MultiLoraTransformersModel.forward_backward_many``."""
    if not requests:
        raise InvalidArgumentError("forward_backward_many needs at least one request")
    states = []
    for name, request in requests.items():
        tenant = model._tenant(name)
        request = dict(request)
        if "inputs" not in request:
            raise InvalidArgumentError(f"request for adapter {name!r} has no 'inputs'")
        states.append(collate(model, tenant, request.pop("inputs"), request))
    tenants = [model.tenants[state.tenant] for state in states]
    # Where every tenant's .grad already is its flat buffer (from its previous steps) the layers
    # add their weight gradients to it themselves, outside autograd (see
    # LoraRouter.direct_weight_grads).
    direct = _direct_grads_ok(tenants)
    with model.router.direct_weight_grads() if direct else nullcontext():
        forward_states(model, states, grad=True)
    total = None
    for state, tenant in zip(states, tenants):
        compute_loss(model, tenant, state, state.loss_kwargs)
        scaled = state.loss_output.loss / tenant.gradient_accumulation_steps
        total = scaled if total is None else total + scaled
    # Attached here, not before the forward, so that a request that fails leaves .grad as it
    # was; a direct pass found them attached already.
    if not direct:
        attach_grads(tenants)
    total.backward()
    for state, tenant in zip(states, tenants):
        record_train_metrics(tenant, state)
    return {state.tenant: public_output(state) for state in states}


def attach_grads(tenants: list[Tenant]) -> None:
    """Before a backward: gradients accumulate into each tenant's flat buffer (``flat.py``)."""
    for tenant in tenants:
        if tenant.flat is not None:
            tenant.flat.attach_grads()


# Off only to measure (bench/direct_grads.py) or test what autograd's own accumulation gives.
DIRECT_WEIGHT_GRADS = True


def _direct_grads_ok(tenants: list[Tenant]) -> bool:
    """Whether the step may use ``direct_weight_grads``: every tenant's ``.grad`` already is its
    flat buffer (attached at its first backward and kept by ``zero_grad``), and no adapter weight
    is frozen or carries a gradient hook (which only autograd's ``AccumulateGrad`` would run)."""
    return DIRECT_WEIGHT_GRADS and all(
        tenant.flat is not None
        and tenant.flat.owns_grads()
        and not any(
            not p.requires_grad or p._backward_hooks or p._post_accumulate_grad_hooks
            for p in tenant.params
        )
        for tenant in tenants
    )


def record_metrics(accumulator: MetricAccumulator, state: ForwardState) -> None:
    out = state.loss_output
    metrics = {k: float(v) for k, v in (out.metrics or {}).items() if k != "loss"}
    accumulator.add(float(out.loss.detach()), state.correct, int(state.mask.sum()), metrics)


def record_train_metrics(tenant: Tenant, state: ForwardState) -> None:
    tenant.pending_grads = True
    tenant.consumed_train_samples += state.num_samples
    record_metrics(tenant.train_metrics, state)


def public_forward_output(state: ForwardState) -> dict[str, Any]:
    return {"logprobs": _row_logprobs(state), "num_tokens": int(state.mask.sum())}


def public_output(state: ForwardState) -> dict[str, Any]:
    out = public_forward_output(state)
    out["loss"] = float(state.loss_output.loss.detach())
    out["metrics"] = {k: float(v) for k, v in (state.loss_output.metrics or {}).items()}
    return out


def _row_logprobs(state: ForwardState) -> list[Any]:
    """Per row, the target log-probs at the trained positions, in order."""
    lp = state.logprobs.detach().cpu()
    mask = state.mask.bool()
    return [lp[i][mask[i]].numpy() for i in range(lp.shape[0])]


def add_loss_inputs(state: ForwardState, kwargs: dict[str, Any]) -> None:
    """Loss inputs given to ``calculate_loss`` instead of ``forward`` (e.g. ``advantages``)."""
    rows, seq = state.targets.shape
    for key in PER_TOKEN_KEYS:
        value = kwargs.pop(key, None)
        if value is not None:
            state.extras[key] = as_float_tensor(value, rows, seq, key)
    state.loss_kwargs.update(kwargs)
