"""Instructions per training step, Twinkle's fused path against a plain PEFT loop, under valgrind.

Wall-clock readings of one tenant's step swing by more than the gap being judged on a shared
2-core machine (docs/performance.md); ``callgrind`` counts the instructions executed instead,
which repeat run to run whatever else the machine does. Each mode of bench/multi_tenant_train.py
runs in its own process (bench/_mode_rss_child.py) twice under ``valgrind --tool=callgrind``, once
with 1 step and once with ``1 + --steps``; the difference, divided by ``--steps``, is one
steady step's instructions (import, model build and the first step cancel out). One torch thread
and a fixed hash seed keep the two runs identical outside the extra steps.

    python bench/step_instructions.py                       # tiny://qwen3.5, N=1, B=1, r16
    python bench/step_instructions.py --modes fused peft --steps 10 --batch 4

Prints one JSON line. Each process takes minutes (valgrind runs Python about 50x slower);
the runs go ``--jobs`` at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(request: dict, workdir: str) -> int:
    """Instructions callgrind counted for one ``bench/_mode_rss_child.py`` run of ``request``."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONHASHSEED="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    out = Path(workdir) / f"{request['mode']}-{request['steps']}.callgrind"
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,  # the interpreter itself: a shim script would be all valgrind saw
            str(HERE / "_mode_rss_child.py"),
            json.dumps(request),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    found = REFS.findall(done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{request['mode']} x {request['steps']}: {done.stderr[-2000:]}")
    return int(found[-1].replace(",", ""))


def steady_step(counted: dict[tuple[str, int], int], modes, steps: int) -> dict[str, int]:
    """One steady step's instructions per mode, from the runs of 1 and ``1 + steps`` steps."""
    return {
        mode: round((counted[(mode, 1 + steps)] - counted[(mode, 1)]) / steps) for mode in modes
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny://qwen3.5")
    parser.add_argument("--ranks", type=int, nargs="+", default=[16])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["fused", "peft"])
    parser.add_argument("--steps", type=int, default=10, help="steps counted (beyond the first)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on PATH (Debian: apt-get install valgrind)")
    runs = [(mode, steps) for mode in args.modes for steps in (1, 1 + args.steps)]
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(args.jobs) as pool:
        counted = dict(
            zip(
                runs,
                pool.map(
                    lambda run: instructions(
                        {
                            "model": args.model,
                            "ranks": args.ranks,
                            "batch": args.batch,
                            "seq": args.seq,
                            "mode": run[0],
                            "steps": run[1],
                            "threads": 1,
                            "keep_freed_memory": True,
                            "max_pass_tokens": None,
                        },
                        workdir,
                    ),
                    runs,
                ),
            )
        )
    per_step = steady_step(counted, args.modes, args.steps)
    report = {
        "model": args.model,
        "tenants": len(args.ranks),
        "ranks": args.ranks,
        "batch": args.batch,
        "seq": args.seq,
        "steps_counted": args.steps,
        "instructions_per_step": per_step,
        "instructions_total": {f"{m}x{s}": n for (m, s), n in counted.items()},
    }
    if "fused" in per_step and "peft" in per_step:
        report["fused_vs_peft_instructions"] = round(per_step["fused"] / per_step["peft"], 4)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
