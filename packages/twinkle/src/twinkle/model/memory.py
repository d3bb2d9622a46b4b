"""Keep freed CPU memory in the process instead of handing it back to the OS (glibc only).

A training step on the CPU allocates and frees the same large temporaries every step (logits,
their gradient, activations). glibc serves blocks above its mmap threshold with fresh ``mmap``
pages and returns freed memory at the top of its heap to the OS; either way the next step's
tensors start on untouched pages, and the kernel's page faults and zero-filling cost as much as
a good part of the arithmetic. Tensors above the largest
threshold glibc allows (32 MiB) gain nothing.

:func:`keep_freed_memory` raises the mmap threshold to that maximum and the trim threshold to
1 GiB, so freed blocks are reused by the next step. The cost: the process keeps its peak heap
instead of shrinking after a spike. It changes the whole process: the server's model and sampler
replicas apply it, and a model built for local training applies it as well
(:func:`apply_process_options`, called by the model's constructor), so a training script runs
its steps as a replica does (measured faster: docs/performance.md, "Local training").
``ExecutionOptions.malloc_tuning`` (default from ``TWINKLE_MALLOC_TUNING``; ``0`` turns it off)
decides. It is a no-op on other C libraries and platforms.

A server runs for days while adapters come and go, so the kept memory must not creep:
:func:`release_freed_memory` (``malloc_trim(0)``) hands the whole free pages inside the heaps
back to the OS. The model replicas call it between tasks at each adapter sweep (at most every
30 s), so the cost, one step's page faults after each release, is paid a few times a minute at
most (the soak's figures: docs/reliability.md). :func:`heap_stats` reads glibc's own account of
the heaps (``mallinfo2``), which tells memory still in use from freed memory kept.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from typing import Any

import torch

from twinkle.model.options import ExecutionOptions

# mallopt(3) parameters.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1 << 30

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_lock = threading.Lock()
_applied: bool | None = None  # None: not tried yet
_malloc_trim: Any = None  # libc's malloc_trim, once keep_freed_memory is in effect


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc >= 2.33), every field a ``size_t``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def keep_freed_memory(enabled: bool | None = None) -> bool:
    """Set glibc's thresholds once per process (see the module docstring).

    Args:
        enabled: ``ExecutionOptions.malloc_tuning``; ``None`` takes the environment's default
            (``TWINKLE_MALLOC_TUNING=0`` turns it off).

    Returns:
        Whether the settings are in effect: False when not enabled, off glibc, or if glibc
        refused them.
    """
    global _applied
    if enabled is None:
        enabled = ExecutionOptions.from_env().malloc_tuning
    if not enabled:
        return False
    with _lock:
        if _applied is None:
            _applied = _apply()
        return _applied


def _apply() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    global _malloc_trim
    _malloc_trim = libc.malloc_trim
    _malloc_trim.argtypes, _malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and (
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    )


def release_freed_memory() -> bool:
    """Hand the free pages of the process's heaps back to the OS (``malloc_trim(0)``), where
    :func:`keep_freed_memory` is in effect (without it glibc trims by itself); whether it ran.
    Call it between steps: the next step faults the pages in again."""
    if not _applied or _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def resident_bytes() -> int:
    """The process's resident set now, in bytes (``/proc/self/statm``; 0 where it is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def release_above(budget_mb: int | None) -> bool:
    """:func:`release_freed_memory` when the resident set is above ``budget_mb`` MiB
    (``ExecutionOptions.memory_budget_mb``), so memory kept for reuse never holds a process
    over its budget between steps; whether it ran. Reading the resident set costs a few
    microseconds: callers run it after each step."""
    if budget_mb is None or resident_bytes() <= budget_mb << 20:
        return False
    return release_freed_memory()


def heap_stats() -> dict[str, int] | None:
    """glibc's account of the process's malloc heaps, in bytes, or None off glibc (or before
    2.33, without ``mallinfo2``). ``in_use``: blocks handed out and not freed (torch's CPU
    tensors, native libraries, the interpreter's large objects), heaps and mmapped blocks
    together; ``free_kept``: freed bytes the heaps keep for reuse (what ``malloc_trim`` can hand
    back); ``mmapped``: the part of ``in_use`` in blocks of their own. The interpreter's small
    objects live in its own arenas, which this does not count."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype, mallinfo2.argtypes = _MallInfo2, []
    info = mallinfo2()
    return {
        "in_use": info.uordblks + info.hblkhd,
        "free_kept": info.fordblks,
        "mmapped": info.hblkhd,
        "heap": info.arena,
    }


def apply_process_options(options: ExecutionOptions) -> None:
    """What a server replica sets for its process, for a model built anywhere: freed memory
    kept (``malloc_tuning``) and ``cpu_threads`` torch threads when given (``None``: torch's own
    choice, one thread per physical core)."""
    keep_freed_memory(options.malloc_tuning)
    if options.cpu_threads is not None and torch.get_num_threads() != options.cpu_threads:
        torch.set_num_threads(options.cpu_threads)
