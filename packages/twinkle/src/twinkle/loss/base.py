"""The contract between a model and its loss: what the model hands over and what it gets back.

The model computes per-token target log-probabilities for a padded batch ``[B, T]`` and calls a
:class:`Loss`; the loss owns its normalisation, so tenants with different losses can share one pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from twinkle.errors import InvalidArgumentError


@dataclass
class LossInputs:
    """Everything a loss may read, all aligned on the padded ``[B, T]`` target grid.

    Attributes:
        logprobs: ``[B, T]`` log p(target_t) under the trained policy (requires grad); 0 where
            ``mask`` is 0.
        mask: ``[B, T]`` float, 1.0 where the token is a trained target, else 0.0.
        target_tokens: ``[B, T]`` int64 target token at each position (-100 where none).
        advantages: ``[B]`` or ``[B, T]`` float advantages (RL losses).
        old_logprobs: ``[B, T]`` behaviour/sampler log-probabilities (tinker's ``logprobs`` input).
        ref_logprobs: ``[B, T]`` reference-model log-probabilities (adapter disabled), no grad.
        weights: ``[B, T]`` per-token weights (tinker ``cross_entropy``).
        target_values: ``[B, T]`` per-token regression targets (``MSELoss``).
        teacher_topk_logprobs: ``[B, T, K]`` a teacher's log-probabilities (or logits) of ``K``
            candidate tokens at each position (distillation).
        topk_logits: ``[B, T, K]`` the policy's logits of the same candidates (requires grad).
        embeddings: ``[B, D]`` one pooled last hidden state per row (``task='embedding'``).
        row_labels: ``[B]`` int64 per-row labels of an embedding batch (1 starts a group).
        extra: free-form per-loss inputs.
    """

    logprobs: torch.Tensor
    mask: torch.Tensor
    target_tokens: torch.Tensor
    advantages: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    target_values: torch.Tensor | None = None
    teacher_topk_logprobs: torch.Tensor | None = None
    topk_logits: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None
    row_labels: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class LossOutput:
    """What a loss returns.

    Attributes:
        loss: scalar to backpropagate, already normalised the way the loss defines.
        num_tokens: number of tokens that counted.
        metrics: plain-named float metrics, e.g. ``{'loss': 1.3, 'clip_frac': 0.1}``.
    """

    loss: torch.Tensor
    num_tokens: int
    metrics: dict[str, float]


class Loss:
    """Base class of every loss; subclasses implement :meth:`__call__`.

    Attributes:
        name: registry name of the loss.
        needs_reference: when True the model fills ``ref_logprobs`` (adapter disabled, no grad)
            unless the request gave them (``ref_logprobs`` / ``ref_outputs``).
        needs_embeddings: when True the model pools each row's last hidden state into
            ``embeddings`` and the batch is an embedding batch (``task='embedding'``).
        pooling: how those rows are pooled: ``'last'`` (last real token) or ``'mean'``.
        pair_rows: when True rows come in (chosen, rejected) pairs that must never be split
            (data-parallel replicas receive whole pairs).
    """

    name: str = "loss"
    needs_reference: bool = False
    needs_embeddings: bool = False
    pooling: str = "last"
    pair_rows: bool = False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        """Compute the loss for one batch.

        Args:
            inputs: the batch, see :class:`LossInputs`.

        Returns:
            The scalar loss, the token count and metrics.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def require(inputs: LossInputs, field_name: str, loss_name: str) -> torch.Tensor:
    """Return ``inputs.<field_name>``, or raise a ValueError naming the loss and the input.

    Args:
        inputs: the loss inputs.
        field_name: the optional field the loss cannot do without.
        loss_name: the loss asking, for the error message.

    Returns:
        The tensor.

    Raises:
        InvalidArgumentError: if the field is None (a ``ValueError``; the server answers 400).
    """
    value = getattr(inputs, field_name)
    if value is None:
        raise InvalidArgumentError(
            f"loss {loss_name!r} requires the input {field_name!r}, which is missing"
        )
    return value


def per_token(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast per-row values ``[B]`` over tokens to ``like``'s ``[B, T]``; ``[B, T]`` passes."""
    if values.dim() == 1:
        return values.to(like.dtype).unsqueeze(-1).expand_as(like)
    return values.to(like.dtype)


def num_tokens(mask_B_T: torch.Tensor) -> int:
    """Count the tokens that the mask selects."""
    return int(mask_B_T.sum().item())


def masked_mean(values_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the masked tokens (0 when there is none)."""
    return (values_B_T * mask_B_T).sum() / mask_B_T.sum().clamp(min=1.0)


def row_sums(values_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """``[B]`` sum of each row's masked values."""
    return (values_B_T * mask_B_T).sum(-1)


def row_means(values_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """``[B]`` mean of each row's masked values (0 for a row without tokens)."""
    return (values_B_T * mask_B_T).sum(-1) / mask_B_T.sum(-1).clamp(min=1.0)


def check_pairs(inputs: LossInputs, loss_name: str) -> None:
    """Refuse a batch that is not (chosen, rejected) row pairs.

    Raises:
        InvalidArgumentError: an odd number of rows.
    """
    rows = inputs.logprobs.shape[0]
    if rows % 2:
        raise InvalidArgumentError(
            f"loss {loss_name!r} needs (chosen, rejected) row pairs (chosen at even rows), "
            f"got an odd batch of {rows} rows"
        )
