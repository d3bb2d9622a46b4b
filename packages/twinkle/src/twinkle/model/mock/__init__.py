"""The ``mock`` model backend: numpy only, deterministic, for CPU-only development and fast
server tests. It never imports torch."""

from twinkle.model.mock._adapter import MetricResult, TrainConfigs
from twinkle.model.mock._model import MockModel, UnknownAdapterError

__all__ = ["MetricResult", "MockModel", "TrainConfigs", "UnknownAdapterError"]
