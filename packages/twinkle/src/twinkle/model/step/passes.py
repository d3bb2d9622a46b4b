"""The forward pass over one or many tenants' batches, stacked: one base-model call whose rows
each go through their own tenant's adapter, then the targets' log-probabilities."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from twinkle.model.lora import LoraRouter, RowRoute
from twinkle.model.step.batch import PAD_VALUES, TenantBatch
from twinkle.model.step.tensors import IGNORE_INDEX, token_logprobs
from twinkle.model.step.vision import vision_inputs


@dataclass
class ForwardState:
    """What one pass gave for one batch.

    Attributes:
        batch: The batch the pass ran on.
        logprobs: ``[B, T]`` log-probabilities of the batch's targets (0 where none).
        ref_logprobs: The same without adapters, where the loss needs a reference.
        correct: Trained positions whose argmax is the target.
        loss_output: The loss's ``LossOutput`` once computed.
    """

    batch: TenantBatch
    logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    correct: int = 0
    loss_output: Any = None


def run_base(
    base_model: torch.nn.Module,
    router: LoraRouter,
    batches: Sequence[TenantBatch],
    routes: list[RowRoute] | None,
    device: torch.device,
) -> torch.Tensor:
    """Logits of one forward over the rows of ``batches`` stacked (right-padded to a common
    length); ``routes`` send each row range to its adapter, ``None`` runs the bare base model.
    Only the rows with images feed the vision tower (:mod:`.vision`)."""
    seq = max(b.tensors["input_ids"].shape[1] for b in batches)
    stacked = {}
    for key, pad in PAD_VALUES.items():
        if all(key in b.tensors for b in batches):
            stacked[key] = torch.cat([pad_to(b.tensors[key], seq, pad) for b in batches]).to(device)
    stacked.pop("labels", None)
    images, vision_routes = vision_inputs(base_model, batches, stacked, device)
    stacked.update(images)
    with router.route(routes or [], vision_routes if routes else None):
        return base_model(**stacked, use_cache=False).logits


def forward_batches(
    base_model: torch.nn.Module,
    router: LoraRouter,
    device: torch.device,
    batches: Sequence[TenantBatch],
    losses: Sequence[Any],
    *,
    grad: bool,
    chunk_bytes: int | None = None,
) -> list[ForwardState]:
    """Each batch's log-probs from one fused pass and, where its loss (``losses[i]``, the loss
    that will apply to ``batches[i]``) wants them, reference log-probs from a bare pass."""
    states = [ForwardState(batch) for batch in batches]
    routes, row = [], 0
    for batch in batches:
        routes.append(RowRoute(batch.tenant, row, row + batch.num_samples))
        row += batch.num_samples
    with torch.set_grad_enabled(grad):
        logits = run_base(base_model, router, batches, routes, device)
        _attach_logprobs(states, logits, "logprobs", chunk_bytes)
    needing_ref = [s for s, loss in zip(states, losses) if getattr(loss, "needs_reference", False)]
    if needing_ref:
        with torch.no_grad():
            logits = run_base(base_model, router, [s.batch for s in needing_ref], None, device)
            _attach_logprobs(needing_ref, logits, "ref_logprobs", chunk_bytes)
    return states


def pad_to(tensor: torch.Tensor, seq: int, value: float | int) -> torch.Tensor:
    """``tensor`` right-padded with ``value`` along dim 1 to length ``seq``."""
    if tensor.shape[1] == seq:
        return tensor
    pad = tensor.new_full((tensor.shape[0], seq - tensor.shape[1], *tensor.shape[2:]), value)
    return torch.cat([tensor, pad], dim=1)


def _attach_logprobs(
    states: list[ForwardState], logits: torch.Tensor, attr: str, chunk_bytes: int | None
) -> None:
    """Log-probs of every state's targets, from one pass over the stacked logits.

    One cross-entropy and one argmax over all rows: slicing the logits per tenant first would make
    backward zero-fill a full-size logits gradient once per tenant.
    """
    seq = logits.shape[1]
    targets = torch.cat([pad_to(s.batch.targets, seq, IGNORE_INDEX) for s in states])
    targets = targets.to(logits.device)
    logprobs = token_logprobs(logits, targets, chunk_bytes)
    row_hits = None
    if attr == "logprobs":
        # Correct predictions per row, for every state at once (padding targets never count): the
        # target's logit is the row's largest. amax + gather, not argmax: torch's CPU argmax over
        # the vocabulary cost more than the cross-entropy itself (7-100x amax at 128-4096 tokens,
        # docs/performance.md); they differ only on an exact tie for the largest logit.
        detached = logits.detach()
        target_logit = detached.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        hits = (target_logit >= detached.amax(-1)) & (targets != IGNORE_INDEX)
        row_hits = hits.sum(-1).tolist()
    row = 0
    for state in states:
        rows, state_seq = state.batch.targets.shape
        setattr(state, attr, logprobs[row : row + rows, :state_seq])
        if row_hits is not None:
            state.correct = sum(row_hits[row : row + rows])
        row += rows


__all__ = ["ForwardState", "forward_batches", "pad_to", "run_base"]
