"""The one thread a replica runs its torch work on, how many CPU threads torch gets there, and
the fixed pool the web handlers hand their blocking work to."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from twinkle.model.memory import keep_freed_memory

T = TypeVar("T")

IO_THREADS = 4
_io_pool: ThreadPoolExecutor | None = None
_io_lock = threading.Lock()


def _started_io_pool() -> ThreadPoolExecutor:
    """``IO_THREADS`` threads, all started now. The event loop's default executor (what
    ``asyncio.to_thread`` uses) starts its threads one by one as concurrency first peaks, up to
    ``min(32, cores + 4)``: a server's thread count then creeps up hours into a run (the soak saw
    it, docs/reliability.md) and grows with the machine, not the work."""
    global _io_pool
    with _io_lock:
        if _io_pool is None:
            pool = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="twinkle-io")
            # A pool starts a thread per submitted task while none is idle: tasks that wait for
            # each other start them all.
            barrier = threading.Barrier(IO_THREADS)
            for task in [pool.submit(barrier.wait, 30) for _ in range(IO_THREADS)]:
                task.result()
            _io_pool = pool
        return _io_pool


async def off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``await asyncio.to_thread(fn, ...)`` on the server's fixed pool of blocking threads:
    file reads, packing and uploads, image decoding, so the event loop keeps serving."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_started_io_pool(), functools.partial(fn, *args, **kwargs))


def model_thread() -> ThreadPoolExecutor:
    """The one thread a model (or in-process sampler) replica runs all its torch work on,
    construction included.

    torch's CPU kernels run on an OpenMP thread team per calling thread. A second thread that
    also calls torch (say, the model built on the replica's main thread, trained on a worker)
    gets a second team, and the two teams' spinning threads fight over the cores (a fused step
    then runs far slower).
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
