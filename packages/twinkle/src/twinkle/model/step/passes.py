"""The forward pass over one or many tenants' batches, stacked: one base-model call whose rows
each go through their own tenant's adapter, then the targets' log-probabilities (and, for the
batches that need them, pooled last hidden states or the logits of a teacher's top-k tokens).

Where the model's LM head is a plain linear layer (with or without tenants' adapters on it), the
pass stops at the last hidden states and the log-probs come from them and the head in tiles of
tokens by vocabulary columns (:mod:`~twinkle.model.step.linear_logprobs`): no ``[tokens, vocab]`` logits are kept. Any
other head (softcapped, scaled, with a bias) gives the logits as the model computes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from twinkle.model.lora import LoraRouter, MultiLoraLinear, RowRoute
from twinkle.model.options import ExecutionOptions
from twinkle.model.step.batch import PAD_VALUES, TenantBatch
from twinkle.model.step.linear_logprobs import LoraHeadRows, VocabShard, linear_token_logprobs
from twinkle.model.step.tensors import IGNORE_INDEX, token_entropies, token_logprobs
from twinkle.model.step.vision import vision_inputs

#: Config fields that put an operation between the LM head and the log-softmax (Gemma's softcap,
#: Cohere's and Granite's logit scales): a model that sets one keeps its materialised logits.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


@dataclass
class ForwardState:
    """What one pass gave for one batch.

    Attributes:
        batch: The batch the pass ran on.
        logprobs: ``[B, T]`` log-probabilities of the batch's targets (0 where none).
        ref_logprobs: The same without adapters, where the loss needs a reference.
        embeddings: ``[B, H]`` pooled last hidden states of an embedding batch.
        topk_logits: ``[B, T, K]`` logits of the teacher's top-k tokens (distillation).
        correct: Trained positions whose argmax is the target.
        entropies: ``[B, T]`` entropies of the predicted distributions, where a metric asks.
        loss_output: The loss's ``LossOutput`` once computed.
    """

    batch: TenantBatch
    logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None
    topk_logits: torch.Tensor | None = None
    correct: int = 0
    entropies: torch.Tensor | None = None
    loss_output: Any = None


@dataclass
class PassOutput:
    """One base-model call's result: ``logits`` ``[B, T, V]``, or, logits-free, the last
    (normalised) ``hidden`` states and the LM ``head`` weight to take log-probs from."""

    logits: torch.Tensor | None
    hidden: torch.Tensor | None
    head: torch.Tensor | None = None
    head_lora: tuple[LoraHeadRows, ...] = ()
    """Rows whose head carries an adapter, with its low-rank part (logits-free passes)."""
    shard: VocabShard | None = None
    """``head`` is this process's vocabulary rows of a head split over a group."""

    def logits_of(self, rows: slice) -> torch.Tensor:
        """Logits of ``rows`` (computed here when the pass kept none)."""
        if self.logits is not None:
            return self.logits[rows]
        enter = self.shard.enter if self.shard is not None else (lambda t: t)
        logits = enter(self.hidden[rows]) @ self.head.T
        start, stop, _ = rows.indices(self.hidden.shape[0])
        for seg in self.head_lora:
            lo, hi = max(start, seg.start), min(stop, seg.end)
            if lo < hi:
                lora_B = seg.lora_B if self.shard is None else self.shard.rows_of(seg.lora_B)
                u = enter(seg.u[lo - seg.start : hi - seg.start])
                part = u @ lora_B.T.to(seg.u.dtype)
                logits[lo - start : hi - start] += part.to(logits.dtype)
        return logits if self.shard is None else self.shard.gather(logits)


def linear_head(base_model: torch.nn.Module) -> torch.Tensor | None:
    """The weight of ``base_model``'s LM head when logits are exactly ``hidden @ weight.T`` (a
    plain ``nn.Linear`` without bias, no logit transform in the config, the decoder reachable as
    the model's base), plus, where the head carries adapters (:func:`lora_head`), each routed
    row's low-rank delta; else ``None``. A model that builds its own decoder (the megatron
    backend's) answers through its ``linear_head_weight()`` (under tensor parallel its vocab
    shard, which its ``vocab_shard()`` describes) and gives the hidden states through its
    ``last_hidden_states(...)``."""
    own = getattr(base_model, "linear_head_weight", None)
    if callable(own):
        return own()
    head = (
        base_model.get_output_embeddings() if hasattr(base_model, "get_output_embeddings") else None
    )
    if isinstance(head, MultiLoraLinear):
        head = head.base_layer
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    config = getattr(base_model, "config", None)
    for part in (config, getattr(config, "text_config", None)):
        for name in LOGIT_TRANSFORMS:
            if getattr(part, name, None) not in (None, 1, 1.0):
                return None
    if getattr(base_model, getattr(base_model, "base_model_prefix", ""), None) is None:
        return None
    return head.weight


def lora_head(base_model: torch.nn.Module) -> MultiLoraLinear | None:
    """The LM head when it carries adapters (a Tinker model's ``train_unembed``, or a
    ``target_modules`` naming it) and :func:`linear_head` takes log-probs from it."""
    head = (
        base_model.get_output_embeddings() if hasattr(base_model, "get_output_embeddings") else None
    )
    return (
        head if isinstance(head, MultiLoraLinear) and linear_head(base_model) is not None else None
    )


def _head_rows(head: MultiLoraLinear | None, hidden: torch.Tensor) -> tuple[LoraHeadRows, ...]:
    """Each routed row range's low-rank input of the head's adapter (dropout where a graph is
    built, as the layer itself applies it), for the logits-free log-probs."""
    if head is None:
        return ()
    rows = []
    for segment in head.segments(hidden.shape[0]):
        x = hidden[segment.start : segment.end]
        if segment.dropout is not None:
            x = segment.dropout(x)
        u = (x @ segment.lora_A.T.to(x.dtype)) * segment.scaling
        rows.append(LoraHeadRows(segment.start, segment.end, u, segment.lora_B))
    return tuple(rows)


def _last_hidden_states(base_model: torch.nn.Module, stacked: dict) -> torch.Tensor:
    """The last (normalised) hidden states of a pass, without the LM head."""
    own = getattr(base_model, "last_hidden_states", None)
    if callable(own):
        return own(**stacked)
    decoder = getattr(base_model, base_model.base_model_prefix)
    return decoder(**stacked, use_cache=False)[0]


def run_base(
    base_model: torch.nn.Module,
    router: LoraRouter,
    batches: Sequence[TenantBatch],
    routes: list[RowRoute] | None,
    device: torch.device,
    *,
    logits_free: bool = False,
    hidden: bool = False,
) -> PassOutput:
    """One forward over the rows of ``batches`` stacked (right-padded to a common length);
    ``routes`` send each row range to its adapter, ``None`` runs the bare base model. Only the
    rows with images feed the vision tower (:mod:`.vision`). ``logits_free`` stops at the last
    hidden states where the head allows (:func:`linear_head`); ``hidden`` asks for them anyway
    (embeddings)."""
    seq = max(b.tensors["input_ids"].shape[1] for b in batches)
    stacked = {}
    for key, pad in PAD_VALUES.items():
        if all(key in b.tensors for b in batches):
            stacked[key] = torch.cat([pad_to(b.tensors[key], seq, pad) for b in batches]).to(device)
    stacked.pop("labels", None)
    images, vision_routes = vision_inputs(base_model, batches, stacked, device)
    stacked.update(images)
    head = linear_head(base_model) if logits_free else None
    with router.route(routes or [], vision_routes if routes else None):
        if head is not None:
            last = _last_hidden_states(base_model, stacked)
            shard = base_model.vocab_shard() if hasattr(base_model, "vocab_shard") else None
            return PassOutput(None, last, head, _head_rows(lora_head(base_model), last), shard)
        out = base_model(**stacked, use_cache=False, output_hidden_states=hidden)
    return PassOutput(out.logits, out.hidden_states[-1] if hidden else None)


def forward_batches(
    base_model: torch.nn.Module,
    router: LoraRouter,
    device: torch.device,
    batches: Sequence[TenantBatch],
    losses: Sequence[Any],
    *,
    grad: bool,
    options: ExecutionOptions | None = None,
    bare: bool = False,
    entropies: bool = False,
) -> list[ForwardState]:
    """Each batch's log-probs from one fused pass and, where its loss (``losses[i]``, the loss
    that will apply to ``batches[i]``) wants them and the request did not give them, reference
    log-probs from a bare pass. ``bare`` runs the main pass itself without adapters (its
    log-probs are then their own reference). ``options``: the model's (log-prob chunks, the
    logits-free head); ``None``: the defaults. ``entropies``: also each token's entropy (for a
    metric that reads it)."""
    options = options or ExecutionOptions()
    states = [ForwardState(batch) for batch in batches]
    routes, row = [], 0
    for batch in batches:
        routes.append(RowRoute(batch.tenant, row, row + batch.num_samples))
        row += batch.num_samples
    hidden = any(b.task == "embedding" for b in batches)
    free = options.linear_logprobs
    with torch.set_grad_enabled(grad):
        out = run_base(
            base_model,
            router,
            batches,
            None if bare else routes,
            device,
            logits_free=free,
            hidden=hidden,
        )
        _attach_logprobs(states, out, "logprobs", options, entropies)
        _attach_embeddings(states, losses, out.hidden)
        _attach_topk_logits(states, out)
        del out
    needing_ref = [
        s
        for s, loss in zip(states, losses)
        if getattr(loss, "needs_reference", False) and s.batch.extras.get("ref_logprobs") is None
    ]
    if bare:
        for state in needing_ref:
            state.ref_logprobs = state.logprobs.detach()
        needing_ref = []
    if needing_ref:
        with torch.no_grad():
            out = run_base(
                base_model, router, [s.batch for s in needing_ref], None, device, logits_free=free
            )
            _attach_logprobs(needing_ref, out, "ref_logprobs", options)
    return states


def _attach_embeddings(
    states: list[ForwardState], losses: Sequence[Any], hidden: torch.Tensor | None
) -> None:
    """One vector per row of each embedding batch: its last real token's hidden state, or the
    mean over its real tokens (the loss's ``pooling``)."""
    row = 0
    for state, loss in zip(states, losses):
        rows = state.batch.num_samples
        if state.batch.task == "embedding":
            width = state.batch.tensors["input_ids"].shape[1]
            mask = state.batch.tensors.get("attention_mask")
            if mask is None:
                mask = torch.ones(rows, width, dtype=torch.long)
            state.embeddings = pool(hidden[row : row + rows, :width], mask.to(hidden.device), loss)
        row += rows


def pool(hidden_B_T_H: torch.Tensor, mask_B_T: torch.Tensor, loss: Any) -> torch.Tensor:
    """``[B, H]``: per row, the last real token's state (any padding side) or the real tokens'
    mean, as ``loss.pooling`` (``'last'`` by default) says."""
    mask = mask_B_T.to(hidden_B_T_H.dtype)
    if getattr(loss, "pooling", "last") == "mean":
        return (hidden_B_T_H * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last_B = (positions * (mask > 0)).amax(-1)
    return hidden_B_T_H[torch.arange(hidden_B_T_H.shape[0], device=mask.device), last_B]


def _attach_topk_logits(states: list[ForwardState], out: PassOutput) -> None:
    """The logits of each distillation batch's teacher top-k token ids, ``[B, T, K]`` (a
    logits-free pass computes that batch's logits alone)."""
    row = 0
    for state in states:
        rows, seq = state.batch.targets.shape
        indices = state.batch.extras.get("teacher_topk_indices")
        if indices is not None:
            mine = out.logits_of(slice(row, row + rows))[:, :seq]
            state.topk_logits = mine.gather(-1, indices.to(mine.device)).float()
        row += rows


def pad_to(tensor: torch.Tensor, seq: int, value: float | int) -> torch.Tensor:
    """``tensor`` right-padded with ``value`` along dim 1 to length ``seq``."""
    if tensor.shape[1] == seq:
        return tensor
    pad = tensor.new_full((tensor.shape[0], seq - tensor.shape[1], *tensor.shape[2:]), value)
    return torch.cat([tensor, pad], dim=1)


def _attach_logprobs(
    states: list[ForwardState],
    out: PassOutput,
    attr: str,
    options: ExecutionOptions,
    entropies: bool = False,
) -> None:
    """Log-probs of every state's targets, from one pass over the stacked rows.

    One cross-entropy and one argmax over all rows: slicing the logits per tenant first would make
    backward zero-fill a full-size logits gradient once per tenant.
    """
    source = out.logits if out.logits is not None else out.hidden
    seq = source.shape[1]
    targets = torch.cat([pad_to(s.batch.targets, seq, IGNORE_INDEX) for s in states])
    targets = targets.to(source.device)
    if out.logits is None:
        logprobs, hits, entropy = linear_token_logprobs(
            out.hidden,
            out.head,
            targets,
            options.linear_chunk_bytes,
            entropies,
            out.head_lora,
            out.shard,
        )
    else:
        logprobs = token_logprobs(out.logits, targets, options.logprob_chunk_bytes)
        hits = None
        entropy = token_entropies(out.logits, options.logprob_chunk_bytes) if entropies else None
    if hits is None and attr == "logprobs":
        # The target's logit is the row's largest. amax + gather, not argmax: torch's CPU argmax
        # over the vocabulary cost more than the cross-entropy itself (7-100x amax at 128-4096
        # tokens, docs/performance.md); they differ only on an exact tie for the largest logit.
        detached = out.logits.detach()
        target_logit = detached.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        hits = (target_logit >= detached.amax(-1)) & (targets != IGNORE_INDEX)
    # Correct predictions per row, for every state at once (padding targets never count).
    row_hits = hits.sum(-1).tolist() if attr == "logprobs" else None
    row = 0
    for state in states:
        rows, state_seq = state.batch.targets.shape
        setattr(state, attr, logprobs[row : row + rows, :state_seq])
        if entropy is not None:
            state.entropies = entropy[row : row + rows, :state_seq]
        if row_hits is not None:
            state.correct = sum(row_hits[row : row + rows])
        row += rows


__all__ = [
    "ForwardState",
    "PassOutput",
    "forward_batches",
    "linear_head",
    "lora_head",
    "pad_to",
    "pool",
    "run_base",
]
