"""Training curves and trackers: :mod:`twinkle_client.tracking`, re-exported unchanged (one
implementation for a local loop, a ``twinkle_client`` loop and the server's stored history)."""

from twinkle_client.tracking import (
    MAX_POINTS,
    HistoryPoint,
    MultiTracker,
    StepAccumulator,
    Tracker,
    TrainingHistory,
    TrainingHistoryRecorder,
    export_history,
    make_tracker,
    register_tracker,
    tracker_names,
)

__all__ = [
    "MAX_POINTS",
    "HistoryPoint",
    "MultiTracker",
    "StepAccumulator",
    "Tracker",
    "TrainingHistory",
    "TrainingHistoryRecorder",
    "export_history",
    "make_tracker",
    "register_tracker",
    "tracker_names",
]
