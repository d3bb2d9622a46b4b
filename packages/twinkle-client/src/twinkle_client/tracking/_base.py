"""The tracker interface, the registry of adapters behind it, and exporting a stored history."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from twinkle_client.tracking.history import TrainingHistory


@runtime_checkable
class Tracker(Protocol):
    """Where a training loop's scalars go: ``log`` one step's figures, ``close`` at the end."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


#: Tracker name -> ``module:Class`` of its adapter, imported on first use (each adapter imports
#: its library only then, so a missing library fails only the tracker that needs it).
_ADAPTERS: dict[str, str] = {
    "tensorboard": "twinkle_client.tracking._tensorboard:TensorBoardTracker",
    "wandb": "twinkle_client.tracking._wandb:WandbTracker",
    "mlflow": "twinkle_client.tracking._mlflow:MlflowTracker",
    "swanlab": "twinkle_client.tracking._swanlab:SwanLabTracker",
}
_FACTORIES: dict[str, Callable[..., Tracker]] = {}


def register_tracker(name: str, factory: Callable[..., Tracker]) -> None:
    """Make ``make_tracker(name, ...)`` build trackers with ``factory(**kwargs)``."""
    _FACTORIES[name] = factory


def tracker_names() -> list[str]:
    """The names :func:`make_tracker` knows."""
    return sorted({*_ADAPTERS, *_FACTORIES})


def make_tracker(kind: str, /, **kwargs: Any) -> Tracker:
    """A tracker by kind: ``tensorboard`` (``path``, ``flush_secs``), ``wandb`` (``project``,
    ``name``, ``path``, ``mode``, ...), ``mlflow`` (``path`` or ``tracking_uri``, ``experiment``,
    ``run_name``),
    ``swanlab`` (``project``, ``name``, ``path``, ``mode``, ...; the ``swanlab`` extra), or one
    added with :func:`register_tracker`.

    Raises:
        ValueError: An unknown name (the message lists the known ones).
        ImportError: The tracker's library is not installed (``pip install
            twinkle-client[tracking]``; for SwanLab ``twinkle-client[swanlab]``).
    """
    if kind in _FACTORIES:
        return _FACTORIES[kind](**kwargs)
    if kind not in _ADAPTERS:
        raise ValueError(f"unknown tracker {kind!r}; expected one of {tracker_names()}")
    module, attr = _ADAPTERS[kind].split(":")
    return getattr(importlib.import_module(module), attr)(**kwargs)


class MultiTracker:
    """Several trackers as one: each ``log`` and ``close`` goes to all of them (every one is
    closed even when another's ``close`` fails; the first failure is raised after)."""

    def __init__(self, trackers: Iterable[Tracker]) -> None:
        self.trackers = list(trackers)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for tracker in self.trackers:
            tracker.log(step, metrics)

    def close(self) -> None:
        failure: BaseException | None = None
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001 - close the others first
                failure = failure or exc
        if failure is not None:
            raise failure


def export_history(history: TrainingHistory, tracker: Tracker, close: bool = True) -> int:
    """Log every point of ``history`` to ``tracker`` (at its step); returns how many.

    Args:
        close: Close the tracker afterwards (flushes its files).
    """
    try:
        for point in history.points:
            tracker.log(point.step, point.scalars())
    finally:
        if close:
            tracker.close()
    return len(history.points)


def check_metrics(step: Any, metrics: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` as ``{str: float}`` for an adapter's ``log``; a bad step or value is a
    ``TypeError`` naming it (booleans and non-numbers are refused; NaN and inf pass)."""
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, got {type(step).__name__}")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or isinstance(value, bool):
            raise TypeError(f"metric {key!r}: names are strings and values numbers")
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"metric {key!r} must be a number, got {value!r}") from None
    return out
