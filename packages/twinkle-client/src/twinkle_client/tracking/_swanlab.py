"""SwanLab, through its own ``swanlab`` library (``mode="offline"`` needs no account or network).

SwanLab is an optional extra apart from ``tracking``: it requires protobuf older than 7, which
the server's dependencies do not allow, so it lives in an environment of its own
(``tools/make_swanlab_venv.sh``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from twinkle_client.tracking._base import check_metrics

INSTALL_HINT = (
    "the 'swanlab' tracker needs the swanlab library: pip install 'twinkle-client[swanlab]' "
    "in an environment whose protobuf is older than 7 (tools/make_swanlab_venv.sh builds one)"
)


class SwanLabTracker:
    """Scalars into one SwanLab run. SwanLab keeps one active run per process, so make one
    ``swanlab`` tracker at a time and close it before the next.

    Args:
        project: The SwanLab project.
        name: The run's (experiment's) name; ``experiment_name`` is the same.
        path: Directory the run's files go under (swanlab's ``log_dir``; default: swanlab's,
            ``./swanlog``). Each run writes ``run-<time>-<id>/run-<id>.swanlab`` there.
        mode: ``offline`` (local files only, uploaded later with ``swanlab sync``), ``local``
            (the same files plus the ``swanlab watch`` dashboard, which needs
            ``swanlab[dashboard]``), ``online`` (needs ``swanlab login``) or ``disabled``.
        config: Hyper-parameters to record with the run.
        **init_kwargs: Anything else ``swanlab.init`` takes (``workspace``, ``tags``, ``group``,
            ``description``, ``settings``).
    """

    def __init__(
        self,
        project: str = "twinkle",
        name: str | None = None,
        path: str | os.PathLike[str] | None = None,
        mode: Literal["offline", "local", "online", "disabled"] = "offline",
        config: Mapping[str, Any] | None = None,
        experiment_name: str | None = None,
        **init_kwargs: Any,
    ) -> None:
        try:
            import swanlab
        except ImportError as error:
            raise ImportError(INSTALL_HINT) from error

        if name is not None and experiment_name is not None and name != experiment_name:
            raise ValueError("give the run's name once: name or experiment_name")
        # Neither prompts nor captures the caller's terminal: a tracker only takes scalars.
        init_kwargs.setdefault(
            "settings",
            swanlab.Settings(
                interactive=False,
                terminal=swanlab.Settings.Terminal(proxy_type="none"),
                probe=swanlab.Settings.Probe(monitor=False),
            ),
        )
        self.run = swanlab.init(
            project=project,
            name=name if name is not None else experiment_name,
            log_dir=None if path is None else os.fspath(path),
            mode=mode,
            config=dict(config or {}),
            **init_kwargs,
        )

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        values = check_metrics(step, metrics)
        if values:
            self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
