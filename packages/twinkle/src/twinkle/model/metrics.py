"""Per-tenant training metrics: what ``calculate_metric`` reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinkle.errors import ArgumentTypeError
from twinkle.metric import Metric as _Metric
from twinkle.metric import MetricInputs, get_metric

# One type: what the client gets, locally too.
from twinkle_client.model.metrics import Metric  # noqa: F401


@dataclass
class MetricAccumulator:
    """Sums over micro-batches since the last report, kept apart for training and evaluation."""

    loss_sum: float = 0.0
    batches: int = 0
    correct: int = 0
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def add(
        self, loss: float, correct: int, tokens: int, extra: dict[str, float] | None = None
    ) -> None:
        self.loss_sum += loss
        self.batches += 1
        self.correct += correct
        self.tokens += tokens
        for key, value in (extra or {}).items():
            self.extra[key] = value

    def report(self) -> dict[str, Any]:
        """Averages since the last report, then start over."""
        result: dict[str, Any] = {
            "loss": self.loss_sum / self.batches if self.batches else None,
            "token_acc": self.correct / self.tokens if self.tokens else None,
            "num_tokens": self.tokens,
        }
        result.update(self.extra)
        self.loss_sum, self.batches, self.correct, self.tokens, self.extra = 0.0, 0, 0, 0, {}
        return result


@dataclass
class AttachedMetrics:
    """The metrics a tenant attached with ``add_metric``, for training and for evaluation.

    The model calls :meth:`update` after each forward (``is_training=True`` after
    ``forward_backward`` / ``backward``, ``False`` after ``forward_only``) and merges
    :meth:`report` into ``calculate_metric``'s result.
    """

    train: list[_Metric] = field(default_factory=list)
    eval: list[_Metric] = field(default_factory=list)
    specs: list[dict[str, Any]] = field(default_factory=list)  # add() calls, to rebuild them

    def add(
        self, metric_cls: str | type[_Metric], is_training: bool | None = None, **kwargs: Any
    ) -> None:
        """Attach a metric by name or class: to training (``True``), evaluation (``False``) or
        both (``None``, a separate instance each).

        Raises:
            InvalidArgumentError: an unknown or client-side metric, or arguments it does not take.
        """
        if is_training is not None and not isinstance(is_training, bool):
            raise ArgumentTypeError(f"is_training must be True, False or None, got {is_training!r}")
        built = [
            get_metric(metric_cls, **kwargs) for _ in range(1 if is_training is not None else 2)
        ]
        if is_training in (None, True):
            self.train.append(built.pop())
        if is_training in (None, False):
            self.eval.append(built.pop())
        name = metric_cls if isinstance(metric_cls, str) else metric_cls.__name__
        self.specs.append({"name": name, "is_training": is_training, **kwargs})

    def wants(self, is_training: bool) -> bool:
        """Whether any metric waits for this kind of forward (skip building inputs if not)."""
        return bool(self.train if is_training else self.eval)

    def wants_entropies(self, is_training: bool) -> bool:
        """Whether a metric of this kind of forward reads per-token entropies."""
        return any(m.needs_entropies for m in (self.train if is_training else self.eval))

    def update(self, is_training: bool, **outputs: Any) -> None:
        """Feed one forward's outputs (tensors or arrays; see ``MetricInputs`` for the names)."""
        metrics = self.train if is_training else self.eval
        if not metrics:
            return
        batch = MetricInputs.from_outputs(**outputs)
        for metric in metrics:
            metric.update(batch)

    def report(self, is_training: bool) -> dict[str, float]:
        """Every attached metric's values since the last report, merged, then reset."""
        result: dict[str, float] = {}
        for metric in self.train if is_training else self.eval:
            result.update(metric.calculate())
            metric.reset()
        return result


def record_attached_metrics(tenant: Any, state: Any, is_training: bool) -> None:
    """Feed one forward of ``tenant`` to its attached metrics (a no-op when none waits).

    Duck-typed so this module imports nothing of the step: ``state`` is a
    ``twinkle.model.step.passes.ForwardState`` after its loss was computed (``batch.mask``,
    ``batch.extras``, ``logprobs``, ``ref_logprobs``, ``correct``, ``loss_output``, and for the
    embedding task ``embeddings`` / ``embedding_labels`` where the state has them); ``tenant``
    a ``twinkle.model.tenant.Tenant`` with an ``attached_metrics`` field.
    """
    attached = getattr(tenant, "attached_metrics", None)
    if attached is None or not attached.wants(is_training):
        return
    extras = state.batch.extras
    ref = extras.get("ref_logprobs")
    out = state.loss_output
    labels = getattr(state, "embedding_labels", None)
    if labels is None:
        labels = getattr(state.batch, "row_labels", None)
    attached.update(
        is_training,
        logprobs=state.logprobs,
        mask=state.batch.mask,
        loss=None if out is None else float(out.loss.detach()),
        loss_metrics=None if out is None else out.metrics,
        ref_logprobs=ref if ref is not None else getattr(state, "ref_logprobs", None),
        old_logprobs=extras.get("old_logprobs"),
        advantages=extras.get("advantages"),
        entropies=getattr(state, "entropies", None),
        correct=getattr(state, "correct", None),
        embeddings=getattr(state, "embeddings", None),
        embedding_labels=labels,
        lr=tenant.lr() if callable(getattr(tenant, "lr", None)) else None,
        step=getattr(tenant, "cur_step", None),
    )
