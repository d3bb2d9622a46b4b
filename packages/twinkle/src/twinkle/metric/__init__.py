"""Metrics: flat ``{name: float}`` reports of what training did.

Model-attached metrics are added by name, ``model.add_metric('DPOMetric', beta=0.1)``; the model
feeds them a :class:`MetricInputs` after each forward and folds their values into
``calculate_metric``. ``CompletionRewardMetric`` lives in the training script. Keys and their
meaning: ``docs/metrics.md``.
"""

from twinkle.metric.base import Metric, MetricInputs
from twinkle.metric.completion_reward import CompletionRewardMetric
from twinkle.metric.dpo import DPOMetric
from twinkle.metric.embedding import EmbeddingMetric
from twinkle.metric.grpo import GRPOMetric
from twinkle.metric.registry import get_metric, known_metrics, register_metric
from twinkle.metric.training import Accuracy, LossMetric, TrainMetric

__all__ = [
    "Accuracy",
    "CompletionRewardMetric",
    "DPOMetric",
    "EmbeddingMetric",
    "GRPOMetric",
    "LossMetric",
    "Metric",
    "MetricInputs",
    "TrainMetric",
    "get_metric",
    "known_metrics",
    "register_metric",
]
