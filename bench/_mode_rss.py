"""Each mode's peak memory for bench/multi_tenant_train.py, each in a fresh process of its own.

The timed modes share one process (and its allocator's history), so that process's peak says
nothing about any one mode. Here every mode of a point runs in its own new Python process that
builds only what the mode needs (fused and sliced: a Twinkle model with the N tenants; limit: one
with the single adapter; peft and peft_gc: the ``PeftModel`` with the N adapters, gradient
checkpointing on for peft_gc), runs ``steps`` steps and reports:

- ``peak_rss_mb``: the process's resident-set high-water mark (Linux ``VmHWM``, read from
  ``/proc/self/status``: ``getrusage``'s ``ru_maxrss`` also counts the parent's resident set at
  the fork, which would charge the benchmark's own memory to every mode);
- ``import_rss_mb``: the resident set once torch, transformers, peft and twinkle are imported,
  before any model is built (the floor every mode shares);
- ``cuda_peak_mb`` on CUDA: ``torch.cuda.max_memory_allocated``.

The process is ``bench/_mode_rss_child.py`` (it imports the benchmark; this module does not, so
the benchmark can import this one without a cycle):

    python bench/_mode_rss_child.py '{"model": "tiny://qwen3.5", "ranks": [8, 16], "batch": 1, "mode": "peft"}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# multi_tenant_train.MODES, without importing it (a bad request fails before the imports)
MODES = ("fused", "sliced", "limit", "peft", "peft_gc")


def rss_mb(field: str = "VmHWM") -> float | None:
    """``field`` (``VmHWM``: the peak, ``VmRSS``: now) of this process in MiB; ``None`` where
    ``/proc`` has no such line (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return None


def measure(
    point: Any,
    modes: tuple[str, ...],
    steps: int = 2,
    threads: int | None = None,
    keep_freed_memory: bool = False,
    timeout_s: float = 1800.0,
    execution: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run each of ``modes`` for ``point`` in a fresh process, one after the other
    (``execution``: the Twinkle model's ``ExecutionOptions`` fields to set, such as
    ``max_pass_tokens``; ``None`` its defaults).

    Returns:
        ``{'peak_rss_mb': {mode: MiB}, 'import_rss_mb': MiB}`` and, on CUDA,
        ``'cuda_peak_mb': {mode: MiB}``.

    Raises:
        RuntimeError: When a process fails (its last output lines in the message).
    """
    results = {}
    for mode in modes:
        request = {
            "model": point.model,
            "ranks": list(point.ranks),
            "batch": point.batch,
            "seq": point.seq,
            "mode": mode,
            "steps": steps,
            "threads": threads,
            "keep_freed_memory": keep_freed_memory,
            "execution": execution or {},
        }
        done = subprocess.run(
            [sys.executable, str(HERE / "_mode_rss_child.py"), json.dumps(request)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            tail = (done.stdout + done.stderr)[-2000:]
            raise RuntimeError(f"memory run of mode {mode!r} failed ({done.returncode}): {tail}")
        results[mode] = json.loads(lines[-1])
    out: dict[str, Any] = {
        "peak_rss_mb": {m: r["peak_rss_mb"] for m, r in results.items()},
        "import_rss_mb": min(r["import_rss_mb"] or 0.0 for r in results.values()),
    }
    if any(r.get("cuda_peak_mb") is not None for r in results.values()):
        out["cuda_peak_mb"] = {m: r.get("cuda_peak_mb") for m, r in results.items()}
    return out
