"""One mode's memory run for bench/_mode_rss.py, in the fresh process that module starts: build
what the mode needs, step it, print the peaks as one JSON line.

    python bench/_mode_rss_child.py '{"model": "tiny://qwen3.5", "ranks": [8, 16], "batch": 1, "mode": "peft"}'
"""

from __future__ import annotations

import json
import sys
from typing import Any

from _mode_rss import MODES, rss_mb


def child(request: dict[str, Any]) -> dict[str, Any]:
    """One mode's run in this (fresh) process: build, ``steps`` steps, the peaks.

    Raises:
        ValueError: For an unknown mode (before the imports: a bad request fails fast).
    """
    if request.get("mode") not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {request.get('mode')!r}")
    import multi_tenant_train as mtt
    import torch

    from twinkle.model.memory import keep_freed_memory

    if request.get("threads"):
        torch.set_num_threads(request["threads"])
    if request.get("keep_freed_memory"):
        keep_freed_memory()
    imported = rss_mb("VmRSS")
    point = mtt.Point(
        request["model"], tuple(request["ranks"]), request["batch"], request.get("seq", mtt.SEQ)
    )
    options = None
    if request.get("execution"):
        from twinkle.model.options import ExecutionOptions

        options = ExecutionOptions.from_env(**request["execution"])
    _, step = mtt.mode_step(point, request["mode"], options)
    for _ in range(request.get("steps", 2)):
        step()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    peak = rss_mb("VmHWM")
    if peak is None:  # no /proc: ru_maxrss (bytes on macOS), which may include the parent's
        import resource

        peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)
    return {
        "mode": request["mode"],
        "peak_rss_mb": peak,
        "import_rss_mb": imported,
        "cuda_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None,
    }


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.argv[1]))), flush=True)
