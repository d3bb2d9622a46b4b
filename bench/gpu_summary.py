"""Read the GPU targets of the fused multi-tenant step from ``bench/gpu_checks.sh``'s output.

    python bench/gpu_summary.py OUT_DIR
    python bench/gpu_summary.py --models    # the models gpu_checks.sh trains, one per line

Prints one JSON line per target with the measured value and whether it is met:

- ``fused_vs_sliced >= 2`` at N=8, B in {1, 4}, per model (``train_*.log``);
- the multi-LoRA linear within 1.15x of the frozen base linear at 4k tokens (``lora_kernel.jsonl``).

A target without a measurement is printed with ``"met": null``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

FUSED_VS_SLICED_TARGET = 2.0
# The models of the fused-vs-sliced target. gpu_checks.sh trains them in this order, taking the
# list from here (``--models``), so the script and the summary cannot drift apart.
MODELS = ("tiny://qwen3-0.5b", "tiny://qwen3.5-25m")
BATCHES = (1, 4)


def _json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut off by a time limit
    return rows


def summarize(out_dir: Path) -> list[dict[str, Any]]:
    train = [
        r
        for log in sorted(out_dir.glob("train_*.log"))
        for r in _json_lines(log)
        if "fused_vs_sliced" in r
    ]
    results = []
    for model in MODELS:
        for batch in BATCHES:
            row = next(
                (
                    r
                    for r in train
                    if r["model"] == model and r["tenants"] == 8 and r["batch"] == batch
                ),
                None,
            )
            value = None if row is None else row["fused_vs_sliced"]
            results.append(
                {
                    "target": f"fused_vs_sliced >= {FUSED_VS_SLICED_TARGET}",
                    "model": model,
                    "tenants": 8,
                    "batch": batch,
                    "value": value,
                    "fused_vs_limit": None if row is None else row["fused_vs_limit"],
                    "met": None if value is None else value >= FUSED_VS_SLICED_TARGET,
                }
            )
    kernel = [r for r in _json_lines(out_dir / "lora_kernel.jsonl") if "ratio" in r]
    if not kernel:
        results.append({"target": "lora_ms / base_ms <= 1.15", "value": None, "met": None})
    for row in kernel:
        results.append(
            {
                "target": f"lora_ms / base_ms <= {row['target_ratio']}",
                "hidden": row["hidden"],
                "tokens": row["tokens"],
                "ranks": row["ranks"],
                "value": row["ratio"],
                "met": row["ratio"] <= row["target_ratio"],
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--models"]:
        print("\n".join(MODELS))
        return 0
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for result in summarize(Path(args[0])):
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
