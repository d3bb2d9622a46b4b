"""Embedding-training metrics: how close anchors are to their positives and to the others."""

from __future__ import annotations

import numpy as np

from twinkle.errors import InvalidArgumentError
from twinkle.metric.base import Metric, MetricInputs
from twinkle.metric.registry import register_metric


@register_metric("EmbeddingMetric")
class EmbeddingMetric(Metric):
    """Cosine similarities of contrastive (InfoNCE) batches.

    Rows come as ``[anchor_0, positive_0, anchor_1, positive_1, ...]``; with
    ``embedding_labels`` a row labelled 1 is an anchor whose positive is the next row. Keys:
    ``pos_sim`` (mean anchor-positive cosine), ``pos_sim_min``, ``pos_sim_max``, ``neg_sim``
    (mean cosine of each anchor with the other anchors' positives, the in-batch negatives) and
    ``loss`` (mean loss of the forwards).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.pos_sum, self.pos_count = 0.0, 0
        self.pos_min, self.pos_max = float("inf"), float("-inf")
        self.neg_sum, self.neg_count = 0.0, 0
        self.loss_sum, self.loss_count = 0.0, 0

    def update(self, batch: MetricInputs) -> None:
        if batch.loss is not None:
            self.loss_sum += batch.loss
            self.loss_count += 1
        if batch.embeddings is None:
            return
        emb_B_D = batch.embeddings.reshape(batch.embeddings.shape[0], -1)
        rows = emb_B_D.shape[0]
        if batch.embedding_labels is not None:
            anchors = np.flatnonzero(batch.embedding_labels)
        else:
            anchors = np.arange(0, rows, 2)
        if anchors.size and anchors[-1] + 1 >= rows:
            raise InvalidArgumentError(f"anchor row {anchors[-1]} has no positive row after it")
        if not anchors.size:
            return
        unit_B_D = emb_B_D / np.maximum(np.linalg.norm(emb_B_D, axis=1, keepdims=True), 1e-12)
        sim_A_A = unit_B_D[anchors] @ unit_B_D[anchors + 1].T
        pos_A = np.diag(sim_A_A)
        self.pos_sum += float(pos_A.sum())
        self.pos_count += int(pos_A.size)
        self.pos_min = min(self.pos_min, float(pos_A.min()))
        self.pos_max = max(self.pos_max, float(pos_A.max()))
        if anchors.size > 1:
            off_diagonal = ~np.eye(anchors.size, dtype=bool)
            self.neg_sum += float(sim_A_A[off_diagonal].sum())
            self.neg_count += int(off_diagonal.sum())

    def calculate(self) -> dict[str, float]:
        out = {}
        if self.pos_count:
            out["pos_sim"] = self.pos_sum / self.pos_count
            out["pos_sim_min"], out["pos_sim_max"] = self.pos_min, self.pos_max
        if self.neg_count:
            out["neg_sim"] = self.neg_sum / self.neg_count
        if self.loss_count:
            out["loss"] = self.loss_sum / self.loss_count
        return out
