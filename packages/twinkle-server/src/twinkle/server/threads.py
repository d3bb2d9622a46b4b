"""The one thread a replica runs its torch work on, and how many CPU threads torch gets there."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from twinkle.model.memory import keep_freed_memory

T = TypeVar("T")


def model_thread() -> ThreadPoolExecutor:
    """The one thread a model (or in-process sampler) replica runs all its torch work on,
    construction included.

    torch's CPU kernels run on an OpenMP thread team per calling thread. A second thread that
    also calls torch (say, the model built on the replica's main thread, trained on a worker)
    gets a second team, and the two teams' spinning threads fight over the cores (a fused step
    then runs far slower; figures: docs/performance-history.md).
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinkle-model")


def cpu_threads(app_config: Any) -> int | None:
    """torch CPU threads for a replica: ``args.execution.cpu_threads``; else ``None`` (leave it) where the
    deployment's ``runtime_env`` sets ``OMP_NUM_THREADS``; else every core this process may use
    (Ray gives a replica with fractional ``num_cpus`` one thread)."""
    execution = getattr(app_config.args, "execution", None)
    configured = execution.cpu_threads if execution is not None else None
    if configured is not None:
        return configured
    if any("OMP_NUM_THREADS" in d.merged_runtime_env().env_vars for d in app_config.deployments):
        return None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def build_on_model_thread(
    build: Callable[[], T], threads: int | None, keep_memory: bool = False
) -> tuple[T, ThreadPoolExecutor]:
    """Run ``build`` on a new :func:`model_thread` with ``threads`` torch CPU threads (``None``:
    leave torch alone, e.g. for the mock backend); returns what it built and the thread.

    ``keep_memory``: the replica process keeps the memory it frees for the next step
    (:func:`~twinkle.model.memory.keep_freed_memory`; the server owns the process, the library
    leaves that choice to its user).
    """

    def run() -> T:
        if keep_memory:
            keep_freed_memory()
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        return build()

    executor = model_thread()
    return executor.submit(run).result(), executor
