"""How each loss normalises, so that data-parallel shards add up to the combined batch's step.

A shard's loss is ``S_r / n_r`` (its own normaliser); the combined batch's loss is
``sum_r S_r / N``. So the combined gradient is ``sum_r (n_r / N) * grad_r``: each rank scales
its gradient by ``n_r / N`` and the ranks all-reduce the sum. Per loss:

==============================  =====================  ====================================
loss                            ``n_r`` (kind)         ``N``
==============================  =====================  ====================================
CrossEntropyLoss mean           sum(weights * mask)    sum over ranks
CrossEntropyLoss sum, tinker    1 (``sum``)            1 (gradients just add up)
GRPOLoss grpo                   rows                   sum over ranks
GRPOLoss bnpo                   tokens                 sum over ranks
GRPOLoss dr_grpo                rows * T_r             sum(rows) * max(T_r)
DPOLoss                         pairs (rows / 2)       sum over ranks
other losses                    rows (assumed mean)    sum over ranks
==============================  =====================  ====================================

DPOLoss with ``sft_weight > 0`` mixes a per-pair and a per-token mean: the pair term is exact,
the SFT term is weighted by pairs too (exact only when chosen rows carry equal token counts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from twinkle.loss.base import Loss

logger = logging.getLogger("twinkle.parallel")

SUM, TOKENS, ROWS, ROWS_X_SEQ = "sum", "tokens", "rows", "rows_x_seq"
_SUM_LOSSES = {
    "cross_entropy",
    "importance_sampling",
    "ppo",
    "cispo",
    "dro",
    "gspo",
    "stable_reinforce",
}
_warned: set[str] = set()


def _loss_name(loss: Any) -> str:
    return getattr(loss, "name", None) or type(loss).__name__


def normaliser_kind(loss: Any) -> str:
    """The kind of ``n_r`` the loss divides by (see the module table)."""
    name = _loss_name(loss)
    if name == "CrossEntropyLoss":
        return SUM if getattr(loss, "reduction", "mean") == "sum" else TOKENS
    if name in _SUM_LOSSES:
        return SUM
    if name == "GRPOLoss":
        return {"grpo": ROWS, "bnpo": TOKENS, "dr_grpo": ROWS_X_SEQ}[loss.loss_type]
    if name == "DPOLoss":
        if getattr(loss, "sft_weight", 0) and "DPOLoss.sft" not in _warned:
            _warned.add("DPOLoss.sft")
            logger.warning(
                "DPOLoss sft_weight > 0 under data parallelism: the SFT term is weighted by pairs"
            )
        return ROWS
    if name not in _warned:
        _warned.add(name)
        logger.warning(
            "loss %r has no data-parallel rule: shards are weighted by rows (a mean over rows)",
            name,
        )
    return ROWS


@dataclass
class ShardStats:
    """What one rank saw of one tenant's rows in the last loss call."""

    norm: float = 0.0  # n_r of this rank (``rows * T_r`` for dr_grpo)
    rows: int = 0
    seq: int = 0
    tokens: int = 0


def shard_stats(loss: Any, inputs: Any) -> ShardStats:
    """``ShardStats`` from a loss's ``LossInputs`` (mask, weights, shape)."""
    kind = normaliser_kind(loss)
    mask = inputs.mask
    rows, seq = int(mask.shape[0]), int(mask.shape[1])
    tokens = int(mask.sum())
    if kind == TOKENS:
        weighted = (
            mask
            if inputs.weights is None or _loss_name(loss) != "CrossEntropyLoss"
            else inputs.weights * mask
        )
        norm = float(weighted.sum())
    elif kind == ROWS:
        norm = float(rows)
    elif kind == ROWS_X_SEQ:
        norm = float(rows * seq)
    else:
        norm = 1.0
    return ShardStats(norm=norm, rows=rows, seq=seq, tokens=tokens)


def global_norm(kind: str, norm_sum: float, rows_sum: int, seq_max: int) -> float:
    """``N``: the combined batch's normaliser from the ranks' reduced stats."""
    if kind == SUM:
        return 1.0
    if kind == ROWS_X_SEQ:
        return float(rows_sum * seq_max)
    return float(norm_sum)


def scale(kind: str, local: ShardStats, total: float) -> float:
    """``n_r / N`` (0 for a rank without rows or a batch without anything to normalise)."""
    if local.rows == 0:
        return 0.0
    if kind == SUM:
        return 1.0
    return local.norm / total if total > 0 else 0.0


class RecordingLoss(Loss):
    """Wraps a tenant's loss (or one request's loss) on a worker and records the
    ``ShardStats`` of its last call. A ``Loss`` itself, so it goes wherever a loss does."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.last: ShardStats | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "name", type(self.inner).__name__)

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.inner, "needs_reference", False))

    def __call__(self, inputs: Any) -> Any:
        self.last = shard_stats(self.inner, inputs)
        return self.inner(inputs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


__all__ = ["RecordingLoss", "ShardStats", "global_norm", "normaliser_kind", "scale", "shard_stats"]
