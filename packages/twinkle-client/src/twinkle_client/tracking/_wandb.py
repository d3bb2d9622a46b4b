"""Weights & Biases, through its own ``wandb`` library (``mode="offline"`` needs no account)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from twinkle_client.tracking._base import check_metrics


class WandbTracker:
    """Scalars into one W&B run.

    Args:
        project: The W&B project.
        name: The run's display name.
        path: Directory the run's local files go under (wandb's ``dir``; default: wandb's).
        mode: ``online``, ``offline`` (synced later with ``wandb sync``) or ``disabled``;
            default: wandb's own (``$WANDB_MODE``, else online).
        config: Hyper-parameters to record with the run.
        **init_kwargs: Anything else ``wandb.init`` takes (``entity``, ``tags``, ``group``).
    """

    def __init__(
        self,
        project: str = "twinkle",
        name: str | None = None,
        path: str | os.PathLike[str] | None = None,
        mode: Literal["online", "offline", "disabled", "shared"] | None = None,
        config: Mapping[str, Any] | None = None,
        **init_kwargs: Any,
    ) -> None:
        import wandb

        if path is not None:
            os.makedirs(path, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=name,
            dir=None if path is None else os.fspath(path),
            mode=mode,
            config=dict(config or {}),
            reinit="create_new",  # several trackers (and runs) in one process
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            **init_kwargs,
        )

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(check_metrics(step, metrics), step=step)

    def close(self) -> None:
        self.run.finish()
