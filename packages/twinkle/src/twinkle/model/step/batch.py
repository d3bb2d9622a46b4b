"""One tenant's micro-batch, collated: the input tensors, the targets on the logits' grid, the
loss mask and the per-token loss inputs.

Two conventions of targets reach the model. Hugging Face ``labels`` are aligned with
``input_ids`` and shifted left here (the model predicts ``labels[t + 1]`` at position ``t``);
Tinker-style ``target_tokens`` already hold the target AT position ``t`` and are not shifted.
A :class:`TenantBatch` says which one it came from in ``alignment``, and its per-token extras
follow the same rule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from twinkle.errors import InvalidArgumentError
from twinkle.loss import loss_from_spec
from twinkle.model.step.loss_inputs import (
    TOPK_KEYS,
    chosen_token_logprobs,
    on_grid,
    ref_from_outputs,
    rename_aliases,
    topk_on_grid,
)
from twinkle.model.step.tensors import (
    IGNORE_INDEX,
    PER_TOKEN_KEYS,
    is_collated,
    shift_left,
    split_inputs,
)

Alignment = Literal["shifted", "aligned"]
Task = Literal["causal_lm", "embedding"]
TASKS = ("causal_lm", "embedding")

#: The input tensors a batch keeps, and the value that pads each to a longer sequence.
PAD_VALUES = {"input_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX, "position_ids": 0}
#: Image inputs a batch keeps as they are (concatenated over rows, never padded).
IMAGE_KEYS = ("pixel_values", "image_grid_thw")


@dataclass(frozen=True)
class TenantBatch:
    """One tenant's collated micro-batch (inputs only; a pass's results live elsewhere).

    Attributes:
        tenant: The adapter name whose rows these are.
        tensors: ``input_ids`` and, when given, ``attention_mask``, ``labels``, ``position_ids``,
            and the image inputs ``pixel_values`` / ``image_grid_thw``.
        targets: ``[B, T]`` target token at each position, ``-100`` where none.
        mask: ``[B, T]`` float, 1 where a target is trained.
        extras: ``advantages``, ``old_logprobs``, ``ref_logprobs``, ``weights``,
            ``target_values`` on the targets' grid (``None`` when not given), and a teacher's
            ``[B, T, K]`` ``teacher_topk_logprobs`` / ``teacher_topk_indices`` when given.
        alignment: ``"shifted"`` when targets are ``labels`` shifted left, ``"aligned"`` when
            they are ``target_tokens`` as given.
        num_samples: Rows in the batch.
        loss_kwargs: Further keyword arguments for the loss.
        loss: The request's own loss, overriding the tenant's (``None``: the tenant's).
        task: ``"causal_lm"`` (log-probs of targets) or ``"embedding"`` (pooled last hidden
            states; no targets, one label per row in ``row_labels``).
        row_labels: ``[B]`` int64 per-row labels of an embedding batch.
    """

    tenant: str
    tensors: dict[str, torch.Tensor]
    targets: torch.Tensor
    mask: torch.Tensor
    extras: dict[str, torch.Tensor | None]
    alignment: Alignment
    num_samples: int
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    loss: Any = None
    task: Task = "causal_lm"
    row_labels: torch.Tensor | None = None


def collate(
    tenant_name: str,
    inputs: Any,
    kwargs: dict[str, Any],
    *,
    template: Any,
    processor: Any,
    vocab_size: int,
    tenant_loss: Any = None,
) -> TenantBatch:
    """Turn a tenant's inputs into padded tensors, targets and loss extras.

    Args:
        tenant_name: The adapter the rows belong to (named in error messages).
        inputs: Collated tensors, encoded features, or trajectories for ``template``.
        kwargs: Loss inputs (``advantages``, ``ref_outputs``, ... a per-request ``loss`` and the
            ``task``); not modified.
        template: The tenant's template; only used (and only needed) when ``inputs`` are not
            collated tensors.
        processor: The tenant's input processor; likewise.
        vocab_size: Token ids must lie in ``[0, vocab_size)``.
        tenant_loss: The tenant's loss; an embedding loss makes ``"embedding"`` the default task.

    Raises:
        InvalidArgumentError: Token ids out of the vocabulary, no labels, a sample longer than the
            template's ``max_length``, an extra of the wrong shape, or a task the loss does not
            fit.
    """
    kwargs = dict(kwargs)
    rename_aliases(kwargs)
    loss = kwargs.pop("loss", None)
    loss = None if loss is None else loss_from_spec(loss)
    task = _task(kwargs.pop("task", None), loss or tenant_loss)
    row_labels = None
    if task == "embedding":
        inputs, row_labels = _embedding_rows(inputs)
    if is_collated(inputs):
        tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    else:
        if template is None or processor is None:
            raise TypeError("collate needs the tenant's template and processor for raw inputs")
        items, needs_template = split_inputs(inputs)
        features = template.batch_encode(items) if needs_template else items
        _check_lengths(tenant_name, template, features)
        try:
            tensors = processor(features)
        except InvalidArgumentError:
            raise
        except ValueError as exc:  # InputFeature's own checks (labels as long as input_ids)
            raise InvalidArgumentError(f"inputs: {exc}") from None
    input_ids = tensors["input_ids"]
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
        raise InvalidArgumentError(f"input_ids out of the vocabulary range [0, {vocab_size})")
    if task == "embedding":
        tensors.pop("labels", None)
        tensors["labels"] = torch.full_like(input_ids, IGNORE_INDEX)
    if "labels" not in tensors and "target_tokens" not in tensors:
        raise InvalidArgumentError(
            "inputs carry no labels: encode them with a template or pass labels"
        )
    rows, seq = input_ids.shape
    alignment: Alignment = "aligned" if "target_tokens" in tensors else "shifted"
    if alignment == "aligned":
        targets = _aligned_targets(tensors, vocab_size)
    else:
        targets = shift_left(tensors["labels"], IGNORE_INDEX)
    mask = (targets != IGNORE_INDEX).float()
    extras = _extras(kwargs, tensors, mask, alignment)
    topk_ids = extras.get("teacher_topk_indices")
    if topk_ids is not None and topk_ids.numel():
        if int(topk_ids.min()) < 0 or int(topk_ids.max()) >= vocab_size:
            raise InvalidArgumentError(
                f"teacher_topk_indices out of the vocabulary range [0, {vocab_size})"
            )
    return TenantBatch(
        tenant=tenant_name,
        tensors={k: tensors[k] for k in (*PAD_VALUES, *IMAGE_KEYS) if k in tensors},
        targets=targets,
        mask=mask,
        extras=extras,
        alignment=alignment,
        num_samples=rows,
        loss_kwargs=kwargs,
        loss=loss,
        task=task,
        row_labels=row_labels,
    )


def _extras(
    kwargs: dict[str, Any], tensors: dict[str, torch.Tensor], mask: torch.Tensor, alignment: str
) -> dict[str, torch.Tensor | None]:
    """The loss inputs on the targets' grid, popped from ``kwargs`` (or taken from per-sample
    values the processor collated); ``ref_outputs`` gives ``ref_logprobs``."""
    ref_outputs = kwargs.pop("ref_outputs", None)
    extras: dict[str, torch.Tensor | None] = {}
    for key in PER_TOKEN_KEYS:
        value = kwargs.pop(key, None)
        if value is None and key in tensors and key not in PAD_VALUES:
            value = tensors[key]
        if key in ("old_logprobs", "ref_logprobs"):
            value = chosen_token_logprobs(value)
        extras[key] = None if value is None else on_grid(value, mask, key, alignment)
    if ref_outputs is not None:
        if extras["ref_logprobs"] is not None:
            raise InvalidArgumentError("pass ref_outputs or ref_logprobs, not both")
        extras["ref_logprobs"] = ref_from_outputs(ref_outputs, mask, alignment)
    extras.update(topk_on_grid(kwargs, mask, alignment))
    return extras


def _task(task: Any, loss: Any) -> Task:
    """The request's task: as given, else ``"embedding"`` for a loss that reads embeddings.

    Raises:
        InvalidArgumentError: an unknown task, or a task the loss cannot train.
    """
    wants = bool(getattr(loss, "needs_embeddings", False))
    if task is None:
        return "embedding" if wants else "causal_lm"
    if task not in TASKS:
        raise InvalidArgumentError(f"task must be one of {TASKS}, got {task!r}")
    if loss is not None and (task == "embedding") != wants:
        name = getattr(loss, "name", type(loss).__name__)
        hint = (
            "set an embedding loss such as 'InfonceLoss'"
            if task == "embedding"
            else "pass task='embedding'"
        )
        raise InvalidArgumentError(f"task={task!r} does not fit the loss {name!r}: {hint}")
    return task


def _embedding_rows(inputs: Any) -> tuple[Any, torch.Tensor | None]:
    """Embedding inputs without their labels (one per row: 1 starts a group, 0 follows), and
    those labels as ``[B]`` (``None`` when no row has one: embeddings only, no loss).

    Raises:
        InvalidArgumentError: a row without a single label while others have one, or
            trajectories (not encoded).
    """
    if is_collated(inputs):
        labels = inputs.get("labels")
        if labels is not None and labels.reshape(labels.shape[0], -1).shape[1] != 1:
            raise InvalidArgumentError(_ONE_LABEL)
        rest = {k: v for k, v in inputs.items() if k != "labels"}
        return rest, None if labels is None else labels.reshape(-1).long()
    items, needs_template = split_inputs(inputs)
    if needs_template:
        raise InvalidArgumentError(
            "task='embedding' takes encoded features (input_ids and one label per row), "
            "not trajectories"
        )
    rows = [dict(item) for item in items]
    if not any("labels" in row for row in rows):
        return rows, None
    labels = []
    for i, row in enumerate(rows):
        label = np.asarray(row.pop("labels", []), dtype=np.float64).reshape(-1)
        if label.size != 1:
            raise InvalidArgumentError(f"inputs[{i}]: {_ONE_LABEL}, got {label.size} values")
        row.pop("length", None)
        labels.append(int(label[0]))
    return rows, torch.tensor(labels, dtype=torch.int64)


_ONE_LABEL = (
    "task='embedding' needs labels with one value per row (1: anchor, 0: its positive or a "
    "negative)"
)


def with_loss_inputs(batch: TenantBatch, kwargs: dict[str, Any]) -> TenantBatch:
    """``batch`` with loss inputs given after the forward (``calculate_loss(advantages=...)``).

    Per-token values follow the batch's ``alignment``; the other keywords join ``loss_kwargs``.
    """
    kwargs = dict(kwargs)
    rename_aliases(kwargs)
    extras = dict(batch.extras)
    given = _extras(kwargs, {}, batch.mask, batch.alignment)
    extras.update({k: v for k, v in given.items() if v is not None})
    return dataclasses.replace(batch, extras=extras, loss_kwargs={**batch.loss_kwargs, **kwargs})


def _aligned_targets(tensors: dict[str, torch.Tensor], vocab_size: int) -> torch.Tensor:
    """``target_tokens`` as targets, -100 on padding; refuses ids outside the vocabulary."""
    targets = tensors["target_tokens"].long().clone()
    if "attention_mask" in tensors:
        targets[tensors["attention_mask"] == 0] = IGNORE_INDEX
    real = targets[targets != IGNORE_INDEX]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab_size):
        raise InvalidArgumentError(f"target_tokens out of the vocabulary range [0, {vocab_size})")
    return targets


def _check_lengths(tenant_name: str, template: Any, features: list[Any]) -> None:
    limit = getattr(template, "max_length", None)
    if not limit:
        return
    for i, feature in enumerate(features):
        length = len(feature["input_ids"])
        if length > limit:
            raise InvalidArgumentError(
                f"adapter {tenant_name!r}: sample {i} has {length} tokens, over max_length={limit}"
            )


__all__ = [
    "IMAGE_KEYS",
    "PAD_VALUES",
    "TASKS",
    "TOPK_KEYS",
    "Alignment",
    "TenantBatch",
    "collate",
    "with_loss_inputs",
]
