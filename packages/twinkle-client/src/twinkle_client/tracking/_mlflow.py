"""MLflow, through its own client (``MlflowClient``); a local file store by default."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twinkle_client.env import MLFLOW_ALLOW_FILE_STORE
from twinkle_client.tracking._base import check_metrics

#: MLflow takes at most this many metrics in one ``log_batch``.
BATCH = 1000
#: Longest time logged metrics wait in memory before they are sent.
FLUSH_S = 5.0


class MlflowTracker:
    """Scalars into one MLflow run (metric history per name, at each step).

    Args:
        path: Directory of a local file store (``mlflow ui --backend-store-uri <path>``);
            used when ``tracking_uri`` is not given. MLflow keeps its file store in
            maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``, which this sets for it
            unless it is set already.
        tracking_uri: Any MLflow tracking URI instead (``sqlite:///mlflow.db``, a server).
        experiment: Experiment name (created when missing).
        run_name: The run's name.
        tags: Tags of the run.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = "mlruns",
        tracking_uri: str | None = None,
        experiment: str = "twinkle",
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        if tracking_uri is None:
            if path is None:
                raise ValueError("MlflowTracker needs path or tracking_uri")
            tracking_uri = Path(path).expanduser().resolve().as_uri()
        if tracking_uri.startswith("file:"):
            os.environ.setdefault(MLFLOW_ALLOW_FILE_STORE.name, "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(
            experiment_id, run_name=run_name, tags=dict(tags or {})
        ).info.run_id
        self._pending: list[Any] = []
        self._sent_at = time.monotonic()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        self._pending += [
            Metric(name, value, now_ms, step)
            for name, value in check_metrics(step, metrics).items()
        ]
        if len(self._pending) >= BATCH or time.monotonic() - self._sent_at >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Send what ``log`` keeps in memory."""
        while self._pending:
            batch, self._pending = self._pending[:BATCH], self._pending[BATCH:]
            self.client.log_batch(self.run_id, metrics=batch)
        self._sent_at = time.monotonic()

    def close(self) -> None:
        self.flush()
        self.client.set_terminated(self.run_id)
