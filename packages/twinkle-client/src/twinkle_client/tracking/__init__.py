"""Training curves: a run's stored history and the trackers it goes to.

- :class:`TrainingHistory` is what ``get_training_history`` returns, from a server
  (``TwinkleClient.get_training_history(run_id)``) or a local model
  (``model.get_training_history(adapter_name=...)``): one :class:`HistoryPoint` per optimizer step.
- A :class:`Tracker` takes ``log(step, metrics)`` and ``close()``; :func:`make_tracker` builds one
  over TensorBoard, Weights & Biases, MLflow or SwanLab (each through its own library, imported
  only when that tracker is made: ``pip install twinkle-client[tracking]``, and
  ``twinkle-client[swanlab]`` apart); :class:`MultiTracker` fans out.
- :func:`export_history` sends a stored history to a tracker.

This package never imports torch; ``twinkle.tracking`` re-exports it unchanged.
"""

from twinkle_client.tracking._base import (
    MultiTracker,
    Tracker,
    export_history,
    make_tracker,
    register_tracker,
    tracker_names,
)
from twinkle_client.tracking.history import (
    MAX_POINTS,
    HistoryPoint,
    StepAccumulator,
    TrainingHistory,
    TrainingHistoryRecorder,
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
