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
from twinkle.model.step.tensors import (
    IGNORE_INDEX,
    PER_TOKEN_KEYS,
    as_float_tensor,
    is_collated,
    pad_rows,
    shift_left,
    split_inputs,
)

Alignment = Literal["shifted", "aligned"]

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
        extras: ``advantages``, ``old_logprobs``, ``ref_logprobs``, ``weights`` on the targets'
            grid (``None`` when not given).
        alignment: ``"shifted"`` when targets are ``labels`` shifted left, ``"aligned"`` when
            they are ``target_tokens`` as given.
        num_samples: Rows in the batch.
        loss_kwargs: Further keyword arguments for the loss.
        loss: The request's own loss, overriding the tenant's (``None``: the tenant's).
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


def collate(
    tenant_name: str,
    inputs: Any,
    kwargs: dict[str, Any],
    *,
    template: Any,
    processor: Any,
    vocab_size: int,
) -> TenantBatch:
    """Turn a tenant's inputs into padded tensors, targets and loss extras.

    Args:
        tenant_name: The adapter the rows belong to (named in error messages).
        inputs: Collated tensors, encoded features, or trajectories for ``template``.
        kwargs: Loss inputs (``advantages``, ... and a per-request ``loss``); not modified.
        template: The tenant's template; only used (and only needed) when ``inputs`` are not
            collated tensors.
        processor: The tenant's input processor; likewise.
        vocab_size: Token ids must lie in ``[0, vocab_size)``.

    Raises:
        InvalidArgumentError: Token ids out of the vocabulary, no labels, a sample longer than the
            template's ``max_length``, or an extra of the wrong shape.
    """
    kwargs = dict(kwargs)
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
    if "labels" not in tensors and "target_tokens" not in tensors:
        raise InvalidArgumentError(
            "inputs carry no labels: encode them with a template or pass labels"
        )
    rows, seq = input_ids.shape
    alignment: Alignment = "aligned" if "target_tokens" in tensors else "shifted"
    extras = {}
    for key in PER_TOKEN_KEYS:
        value = kwargs.pop(key, None)
        if value is None and key in tensors and key not in PAD_VALUES:
            value = tensors[key]
        extras[key] = None if value is None else per_token(value, rows, seq, key, alignment)
    if alignment == "aligned":
        targets = _aligned_targets(tensors, vocab_size)
    else:
        targets = shift_left(tensors["labels"], IGNORE_INDEX)
    loss = kwargs.pop("loss", None)
    return TenantBatch(
        tenant=tenant_name,
        tensors={k: tensors[k] for k in (*PAD_VALUES, *IMAGE_KEYS) if k in tensors},
        targets=targets,
        mask=(targets != IGNORE_INDEX).float(),
        extras=extras,
        alignment=alignment,
        num_samples=rows,
        loss_kwargs=kwargs,
        loss=None if loss is None else loss_from_spec(loss),
    )


def with_loss_inputs(batch: TenantBatch, kwargs: dict[str, Any]) -> TenantBatch:
    """``batch`` with loss inputs given after the forward (``calculate_loss(advantages=...)``).

    Per-token values follow the batch's ``alignment``; the other keywords join ``loss_kwargs``.
    """
    kwargs = dict(kwargs)
    rows, seq = batch.targets.shape
    extras = dict(batch.extras)
    for key in PER_TOKEN_KEYS:
        value = kwargs.pop(key, None)
        if value is not None:
            extras[key] = per_token(value, rows, seq, key, batch.alignment)
    return dataclasses.replace(batch, extras=extras, loss_kwargs={**batch.loss_kwargs, **kwargs})


def per_token(value: Any, rows: int, seq: int, name: str, alignment: Alignment) -> torch.Tensor:
    """A per-row ([B]) or per-token value on the targets' grid: shifted like ``labels``, or
    as given next to ``target_tokens``."""
    if alignment == "shifted":
        return as_float_tensor(value, rows, seq, name)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if all(np.ndim(v) == 0 for v in value):
        return as_float_tensor(value, rows, seq, name)
    return pad_rows(value, rows, seq, name)  # aligned already: no shift


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
    "Alignment",
    "TenantBatch",
    "collate",
    "per_token",
    "with_loss_inputs",
]
