"""The metric contract: accumulate, calculate a flat dict of floats, reset.

Two kinds share it. Model-attached metrics (``model.add_metric('DPOMetric', beta=0.1)``) are fed
by the model after each forward with a :class:`MetricInputs` through :meth:`Metric.update`;
client-side metrics (``CompletionRewardMetric``) are fed by the script through
:meth:`Metric.accumulate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from twinkle.errors import ArgumentTypeError


def to_numpy(value: Any, dtype: Any = np.float64) -> np.ndarray | None:
    """A numpy copy of a list, array or tensor (detached, on the CPU), or ``None``."""
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=dtype)


@dataclass
class MetricInputs:
    """What one forward gave for one tenant's micro-batch, as numpy, rows in the batch's order.

    Attributes:
        logprobs: ``[B, T]`` log-probabilities of the targets under the trained policy (0 where
            ``mask`` is 0).
        mask: ``[B, T]`` 1.0 where a target is trained.
        loss: The loss value of the batch.
        loss_metrics: The loss's own metrics (``LossOutput.metrics``).
        ref_logprobs: ``[B, T]`` reference-model log-probabilities, where the loss had them.
        old_logprobs: ``[B, T]`` behaviour (sampler) log-probabilities, where given.
        advantages: ``[B]`` or ``[B, T]`` advantages, where given.
        entropies: ``[B, T]`` per-token entropies, where computed.
        correct: Trained positions whose argmax is the target.
        embeddings: ``[B, D]`` pooled embeddings (embedding task).
        embedding_labels: ``[B]`` 1 for an anchor row (its positive is the next row), 0 else.
        lr: The tenant's learning rate at the time of the forward.
        step: The tenant's optimizer step at the time of the forward.
    """

    logprobs: np.ndarray | None = None
    mask: np.ndarray | None = None
    loss: float | None = None
    loss_metrics: dict[str, float] = field(default_factory=dict)
    ref_logprobs: np.ndarray | None = None
    old_logprobs: np.ndarray | None = None
    advantages: np.ndarray | None = None
    entropies: np.ndarray | None = None
    correct: int | None = None
    embeddings: np.ndarray | None = None
    embedding_labels: np.ndarray | None = None
    lr: float | None = None
    step: int | None = None

    @classmethod
    def from_outputs(cls, **fields: Any) -> MetricInputs:
        """Build from tensors or arrays (converted to float64 numpy; scalars to Python)."""
        unknown = set(fields) - set(cls.__dataclass_fields__)
        if unknown:
            raise ArgumentTypeError(f"MetricInputs has no fields {sorted(unknown)}")
        arrays = ("logprobs", "mask", "ref_logprobs", "old_logprobs", "advantages", "entropies")
        out = {k: to_numpy(v) for k, v in fields.items() if k in arrays}
        if fields.get("embeddings") is not None:
            out["embeddings"] = to_numpy(fields["embeddings"])
        if fields.get("embedding_labels") is not None:
            out["embedding_labels"] = to_numpy(fields["embedding_labels"]).reshape(-1)
        for key in ("loss", "lr"):
            if fields.get(key) is not None:
                out[key] = float(fields[key])
        for key in ("correct", "step"):
            if fields.get(key) is not None:
                out[key] = int(fields[key])
        out["loss_metrics"] = {k: float(v) for k, v in (fields.get("loss_metrics") or {}).items()}
        return cls(**out)

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum()) if self.mask is not None else 0


class Metric:
    """Base class of metrics.

    ``calculate`` returns a flat ``{name: float}`` of the state since the last ``reset`` and
    leaves the state alone; whoever reports (``calculate_metric``) resets afterwards.
    """

    name: ClassVar[str] = "metric"
    #: The model computes per-token entropies of the predicted distribution for this metric
    #: (``MetricInputs.entropies``); they cost one more pass over each chunk of logits.
    needs_entropies: ClassVar[bool] = False

    def update(self, batch: MetricInputs) -> None:
        """Fold one forward's outputs in (model-attached metrics implement this)."""
        raise NotImplementedError(f"{type(self).__name__} is not fed by a model")

    def accumulate(self, inputs: Any = None, outputs: Any = None, **kwargs: Any) -> None:
        """Upstream's entry point. Model-attached metrics take a :class:`MetricInputs` as
        ``outputs``; client-side metrics override this."""
        if not isinstance(outputs, MetricInputs):
            raise ArgumentTypeError(
                f"{type(self).__name__}.accumulate expects outputs=MetricInputs(...), "
                f"got {type(outputs).__name__}"
            )
        self.update(outputs)

    def calculate(self) -> dict[str, float]:
        """The metric values since the last reset."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget everything accumulated."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
