"""TensorBoard event files, written by tensorboard's own event writer (the one torch's
``SummaryWriter`` wraps), so the torch-free client can write them too."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from twinkle_client.tracking._base import check_metrics


class TensorBoardTracker:
    """Scalars into TensorBoard event files under ``path`` (``tensorboard --logdir path``).

    Args:
        path: The log directory (created when missing).
        flush_secs: Longest time a logged scalar waits in memory before it reaches the file.
    """

    def __init__(self, path: str | os.PathLike[str], flush_secs: float = 10.0) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.path = os.fspath(path)
        self._writer = EventFileWriter(self.path, flush_secs=flush_secs)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [
            Summary.Value(tag=name, simple_value=value)
            for name, value in check_metrics(step, metrics).items()
        ]
        if values:
            event = Event(wall_time=time.time(), step=step, summary=Summary(value=values))
            self._writer.add_event(event)

    def close(self) -> None:
        self._writer.close()
