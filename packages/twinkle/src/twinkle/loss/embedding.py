"""Contrastive embedding training: InfoNCE over pooled last hidden states.

An embedding batch (``forward_backward(..., task='embedding')``) carries one label per row:
``1`` starts a group (its anchor), the ``0`` rows after it are the anchor's positive and then
its hard negatives: ``[anchor, positive, negative..., anchor, positive, ...]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twinkle.errors import InvalidArgumentError
from twinkle.loss.base import Loss, LossInputs, LossOutput, require
from twinkle.loss.registry import register_loss

_POOLINGS = ("last", "mean")


@register_loss("InfonceLoss")
class InfonceLoss(Loss):
    """InfoNCE on cosine similarities: each anchor must pick its positive among candidate
    documents, cross entropy over ``cos / temperature``, averaged over groups.

    Args:
        temperature: softmax temperature of the similarities.
        use_batch: the candidates are every document of the batch (in-batch negatives); else
            only the group's own positive and negatives.
        hard_negatives: keep exactly this many negatives per group (the first ones, repeated
            in order when a group has fewer); ``None`` keeps each group's own.
        pooling: a row's embedding is its last real token's hidden state (``'last'``) or the
            mean over its real tokens (``'mean'``).

    Raises:
        InvalidArgumentError: temperature <= 0, hard_negatives < 0 or an unknown pooling.
    """

    needs_embeddings = True

    def __init__(
        self,
        temperature: float = 0.1,
        use_batch: bool = True,
        hard_negatives: int | None = None,
        pooling: str = "last",
    ):
        if temperature <= 0:
            raise InvalidArgumentError(f"InfonceLoss temperature must be > 0, got {temperature}")
        if hard_negatives is not None and hard_negatives < 0:
            raise InvalidArgumentError(
                f"InfonceLoss hard_negatives must be >= 0, got {hard_negatives}"
            )
        if pooling not in _POOLINGS:
            raise InvalidArgumentError(
                f"InfonceLoss pooling must be one of {_POOLINGS}, got {pooling!r}"
            )
        self.temperature = temperature
        self.use_batch = bool(use_batch)
        self.hard_negatives = hard_negatives
        self.pooling = pooling

    def __call__(self, inputs: LossInputs) -> LossOutput:
        emb_B_D = F.normalize(require(inputs, "embeddings", self.name).float(), dim=-1)
        groups = self._groups(require(inputs, "row_labels", self.name))
        anchors_G_D = emb_B_D[[g[0] for g in groups]]
        docs = [g[1:] for g in groups]
        if self.use_batch:
            flat = [i for d in docs for i in d]
            candidates_D_C = emb_B_D[flat].T
            starts = torch.tensor([0, *[len(d) for d in docs[:-1]]]).cumsum(0)
            sims_G_C = anchors_G_D @ candidates_D_C
            targets_G = starts.to(sims_G_C.device)
        else:
            width = max(len(d) for d in docs)
            sims_G_C = torch.full((len(groups), width), float("-inf"), device=emb_B_D.device)
            for g, d in enumerate(docs):
                sims_G_C[g, : len(d)] = emb_B_D[d] @ anchors_G_D[g]
            targets_G = torch.zeros(len(groups), dtype=torch.int64, device=emb_B_D.device)
        loss = F.cross_entropy(sims_G_C / self.temperature, targets_G)
        return LossOutput(
            loss=loss,
            num_tokens=int(emb_B_D.shape[0]),
            metrics=self._metrics(loss, sims_G_C, targets_G),
        )

    def _groups(self, labels_B: torch.Tensor) -> list[list[int]]:
        """Row indices per group ``[anchor, positive, negatives...]``, negatives trimmed or
        repeated to ``hard_negatives``."""
        labels = [int(v) for v in labels_B.tolist()]
        if not labels or labels[0] != 1:
            raise InvalidArgumentError(
                "InfonceLoss: the first row of an embedding batch must be an anchor (label 1); "
                f"got labels {labels[:8]}"
            )
        groups: list[list[int]] = []
        for i, label in enumerate(labels):
            if label == 1:
                groups.append([i])
            elif label == 0:
                groups[-1].append(i)
            else:
                raise InvalidArgumentError(
                    f"InfonceLoss: row labels must be 1 (anchor) or 0, got {label} at row {i}"
                )
        for g in groups:
            if len(g) < 2:
                raise InvalidArgumentError(
                    f"InfonceLoss: the anchor at row {g[0]} has no positive (label 0) after it"
                )
        if self.hard_negatives is not None:
            groups = [self._fix_negatives(g) for g in groups]
        return groups

    def _fix_negatives(self, group: list[int]) -> list[int]:
        negatives = group[2:]
        if self.hard_negatives and not negatives:
            raise InvalidArgumentError(
                f"InfonceLoss: hard_negatives={self.hard_negatives} but the group at row "
                f"{group[0]} has no negative"
            )
        n = self.hard_negatives or 0
        return group[:2] + [negatives[k % len(negatives)] for k in range(n)]

    def _metrics(self, loss, sims_G_C, targets_G) -> dict[str, float]:
        sims = sims_G_C.detach()
        rows = torch.arange(sims.shape[0], device=sims.device)
        positive_G = sims[rows, targets_G]
        others = torch.isfinite(sims).clone()
        others[rows, targets_G] = False
        accuracy = (sims.argmax(-1) == targets_G).float().mean()
        metrics = {
            "loss": float(loss.detach()),
            "pos_sim": float(positive_G.mean()),
            "accuracy": float(accuracy),
        }
        if others.any():
            metrics["neg_sim"] = float(sims[others].mean())
        return metrics
