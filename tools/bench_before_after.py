"""Benchmarks' ``--quick`` runs on an older commit and on this checkout, interleaved, in one run.

A change that only moves code (a restructure) should leave the figures within the host's swing;
this tool shows it side by side. The older commit is checked out as a ``git worktree`` in a
temporary folder and run from its own sources (``PYTHONPATH`` puts its three ``src`` folders
first, so ``twinkle``, ``twinkle.server`` and ``twinkle_client`` resolve there); this checkout
runs from the installed packages. Each benchmark runs ``--rounds`` times per tree, alternating
(before, after, before, after, ...), so both trees see the same machine.

Prints the benchmarks' own JSON lines, each with ``"tree": "before" | "after"`` and ``"round"``
added, then one ``{"compare": ...}`` line per benchmark with the median of each figure per tree
and the ratio after/before.

    python tools/bench_before_after.py 5746cd1                      # the default benchmarks
    python tools/bench_before_after.py 5746cd1 --bench tinker_throughput --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Each benchmark's ``--quick`` command line and the figures compared (keys of its JSON lines;
#: a line is identified by the values of its ``key`` fields).
BENCHES = {
    "multi_tenant_train": {
        "args": ["--quick", "--no-rss", "--models", "tiny://qwen3.5"],
        "key": ("model", "tenants", "batch"),
        "figures": ("fused_tps", "limit_tps", "peft_tps", "fused_vs_peft", "fused_vs_limit"),
    },
    "tinker_throughput": {
        "args": ["--quick"],
        "key": ("tenants",),
        "figures": ("tokens_per_s",),
    },
    "server_overhead": {
        "args": ["--quick", "--shape", "8x128"],
        "key": ("kind", "path", "tenants"),
        "figures": ("overhead_p50_ms", "remote_p50_ms", "server_tps", "ratio"),
    },
}


def worktree(ref: str, into: Path) -> Path:
    tree = into / "before"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    return tree


def run(tree: Path, bench: str, before: bool, timeout_s: float) -> list[dict]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if before:
        src = [
            tree / "packages" / p / "src" for p in ("twinkle", "twinkle-server", "twinkle-client")
        ]
        env["PYTHONPATH"] = os.pathsep.join([*map(str, src), env.get("PYTHONPATH", "")])
    command = [sys.executable, str(tree / "bench" / f"{bench}.py"), *BENCHES[bench]["args"]]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tree, timeout=timeout_s
    )
    lines = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    if done.returncode != 0:
        raise RuntimeError(
            f"{bench} ({'before' if before else 'after'}) failed: {done.stderr[-2000:]}"
        )
    return lines


def compare(bench: str, records: list[dict]) -> list[dict]:
    """Per line identity: the median of each figure per tree and the ratio after/before."""
    spec = BENCHES[bench]
    groups: dict[tuple, dict[str, dict[str, list[float]]]] = {}
    for record in records:
        if not any(isinstance(record.get(f), (int, float)) for f in spec["figures"]):
            continue  # a meta line
        ident = tuple(record.get(k) for k in spec["key"])
        tree = groups.setdefault(ident, {}).setdefault(record["tree"], {})
        for figure in spec["figures"]:
            if isinstance(record.get(figure), (int, float)):
                tree.setdefault(figure, []).append(float(record[figure]))
    out = []
    for ident, trees in groups.items():
        row: dict = {
            "compare": bench,
            **{k: v for k, v in zip(spec["key"], ident) if v is not None},
        }
        for figure in spec["figures"]:
            before = trees.get("before", {}).get(figure)
            after = trees.get("after", {}).get(figure)
            if not before or not after:
                continue
            b, a = statistics.median(before), statistics.median(after)
            row[figure] = {"before": round(b, 3), "after": round(a, 3)}
            if b:
                row[figure]["after_over_before"] = round(a / b, 3)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ref", help="the older commit (any git revision)")
    parser.add_argument("--bench", action="append", choices=sorted(BENCHES), default=None)
    parser.add_argument("--rounds", type=int, default=2, help="runs per tree (alternating)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per benchmark run")
    args = parser.parse_args(argv)
    benches = args.bench or list(BENCHES)
    with tempfile.TemporaryDirectory(prefix="twinkle-before-") as tmp:
        tree = worktree(args.ref, Path(tmp))
        try:
            for bench in benches:
                records = []
                for round_ in range(args.rounds):
                    for before in (True, False):
                        where = tree if before else ROOT
                        for line in run(where, bench, before, args.timeout_s):
                            line.update(tree="before" if before else "after", round=round_)
                            records.append(line)
                            print(json.dumps(line), flush=True)
                for row in compare(bench, records):
                    print(json.dumps(row), flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
