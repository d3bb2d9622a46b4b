"""After the pass: each tenant's loss on its own rows, its metrics, and what the caller gets back."""

from __future__ import annotations

from typing import Any

from twinkle.loss import LossInputs
from twinkle.model.metrics import MetricAccumulator, record_attached_metrics
from twinkle.model.step.batch import TenantBatch
from twinkle.model.step.passes import ForwardState
from twinkle.model.tenant import Tenant


def loss_of(batch: TenantBatch, tenant: Tenant) -> Any:
    """The loss that applies to ``batch``: its request's own, else the tenant's."""
    return batch.loss or tenant.loss


def compute_loss(state: ForwardState, loss: Any) -> None:
    """Apply ``loss`` to the state's log-probs; the result goes to ``state.loss_output``."""
    batch = state.batch
    device = state.logprobs.device
    extras = {k: (v.to(device) if v is not None else None) for k, v in batch.extras.items()}
    ref = extras.pop("ref_logprobs")
    inputs = LossInputs(
        logprobs=state.logprobs,
        mask=batch.mask.to(device),
        target_tokens=batch.targets.to(device),
        advantages=extras["advantages"],
        old_logprobs=extras["old_logprobs"],
        ref_logprobs=ref if ref is not None else state.ref_logprobs,
        weights=extras["weights"],
        target_values=extras.get("target_values"),
        teacher_topk_logprobs=extras.get("teacher_topk_logprobs"),
        topk_logits=state.topk_logits,
        embeddings=state.embeddings,
        row_labels=batch.row_labels,
        extra=dict(batch.loss_kwargs),
    )
    state.loss_output = loss(inputs)


def record_metrics(accumulator: MetricAccumulator, state: ForwardState) -> None:
    """Add the state's loss, accuracy and the loss's own metrics to ``accumulator``."""
    out = state.loss_output
    metrics = {k: float(v) for k, v in (out.metrics or {}).items() if k != "loss"}
    accumulator.add(float(out.loss.detach()), state.correct, int(state.batch.mask.sum()), metrics)


def record_train_metrics(tenant: Tenant, state: ForwardState) -> None:
    """After a backward: the tenant has gradients, its progress and training metrics advance."""
    tenant.pending_grads = True
    tenant.consumed_train_samples += state.batch.num_samples
    record_metrics(tenant.train_metrics, state)
    record_attached_metrics(tenant, state, True)
    out = state.loss_output
    tenant.history.forward_backward(
        float(out.loss.detach()),
        int(state.batch.mask.sum()),
        {k: float(v) for k, v in (out.metrics or {}).items()},
    )


def public_forward_output(state: ForwardState) -> dict[str, Any]:
    """``{'logprobs': [per-row target log-probs], 'num_tokens': int}``, and the rows'
    ``embeddings`` for an embedding batch."""
    out = {"logprobs": _row_logprobs(state), "num_tokens": int(state.batch.mask.sum())}
    if state.embeddings is not None:
        out["embeddings"] = list(state.embeddings.detach().float().cpu().numpy())
    return out


def public_output(state: ForwardState) -> dict[str, Any]:
    """:func:`public_forward_output` with the loss value and the loss's metrics."""
    out = public_forward_output(state)
    out["loss"] = float(state.loss_output.loss.detach())
    out["metrics"] = {k: float(v) for k, v in (state.loss_output.metrics or {}).items()}
    return out


def _row_logprobs(state: ForwardState) -> list[Any]:
    """Per row, the target log-probs at the trained positions, in order."""
    lp = state.logprobs.detach().cpu()
    mask = state.batch.mask.bool()
    return [lp[i][mask[i]].numpy() for i in range(lp.shape[0])]


__all__ = [
    "compute_loss",
    "loss_of",
    "public_forward_output",
    "public_output",
    "record_metrics",
    "record_train_metrics",
]
