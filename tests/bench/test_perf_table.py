"""bench/perf_table.py: issue 29's targets judged per point from the benchmark's JSON lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "bench" / "perf_table.py"
_spec = importlib.util.spec_from_file_location("perf_table", _PATH)
perf_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(perf_table)


def _point(tenants, batch, fused, sliced, peft, limit, rss=None):
    line = {
        "model": "tiny://qwen3.5-25m",
        "tenants": tenants,
        "batch": batch,
        "ranks": [16] * tenants,
        "fused_tps": fused,
        "sliced_tps": sliced,
        "peft_tps": peft,
        "limit_tps": limit,
        "fused_vs_limit": round(fused / limit, 3),
        "fused_vs_peft": round(fused / peft, 3),
    }
    if rss:
        line["peak_rss_mb"] = {"fused": rss[0], "peft": rss[1], "sliced": 1, "limit": 1}
    return line


def test_each_target_is_judged_against_its_own_threshold():
    # N=8, B=1: beats both peers, 0.95 of limit, 1.25x peft (under 1.3), RSS 1.2x peft.
    many = perf_table.checks(_point(8, 1, 125, 100, 100, 131.6, rss=(120, 100)))
    assert many == {"best": True, "limit": True, "peft x1.3": False, "rss": True}
    # B=4: the 1.3x-peft target does not apply; sliced beats fused; RSS 1.4x peft.
    wide = perf_table.checks(_point(4, 4, 99, 100, 90, 99, rss=(140, 100)))
    assert wide == {"best": False, "limit": True, "peft x1.3": None, "rss": False}
    # Without the memory processes the RSS target is not judged.
    assert perf_table.checks(_point(1, 1, 100, 100, 100, 120))["rss"] is None
    assert perf_table.checks(_point(1, 1, 100, 100, 100, 120))["limit"] is False


def test_the_table_counts_the_points_meeting_each_target():
    lines = [{"meta": {}}, _point(8, 1, 140, 100, 100, 141), _point(1, 4, 99, 100, 90, 99)]
    table = perf_table.render(lines)
    rows = [r for r in table.splitlines() if r.startswith("| qwen3.5-25m")]
    assert len(rows) == 2 and rows[1].count("**no**") == 1
    assert table.rstrip().endswith("best: 1 of 2, limit: 2 of 2, peft x1.3: 1 of 1.")
