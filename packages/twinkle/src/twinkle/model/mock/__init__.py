"""The ``mock`` model backend: numpy only, deterministic, for CPU-only development and fast
server tests. It never imports torch."""

from twinkle.model.mock._adapter import MetricResult
from twinkle.model.mock._model import MockModel, UnknownAdapterError, model_vocab_size
from twinkle_client.types import TrainConfigs

__all__ = [
    "MetricResult",
    "MockModel",
    "TrainConfigs",
    "UnknownAdapterError",
    "model_vocab_size",
]
