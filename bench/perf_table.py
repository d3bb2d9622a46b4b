"""Render ``bench/multi_tenant_train.py`` JSON lines as the markdown table of docs/performance.md,
with issue 29's targets checked per point, and issue 45's on the real-vocabulary points.

    python bench/perf_table.py results.jsonl > table.md

Targets (each a column; ``yes``/``no``):
- ``best``: fused tokens/s >= 1.0x the better of ``sliced`` and ``peft``;
- ``limit``: fused >= 0.9x ``limit`` (one adapter over every row: the ceiling of a fused step);
- ``peft x1.3``: at N >= 4 and B = 1, fused >= 1.3x ``peft`` (blank elsewhere);
- ``rss``: fused's own peak resident set <= 1.3x peft's (blank when the run had ``--no-rss``).
The last line counts the points meeting each target.

Issue 45's targets, judged on the points of a real-vocabulary model (``vocab_size`` >= 100,000 in
the line; ``--real-vocab``) that carry the ``peft_gc`` mode, in a second table (``met``/``unmet``):
- ``x1.3 faster peft``: at N = 8, B = 1, fused >= 1.3x the faster of ``peft`` and ``peft_gc``;
- ``x0.9 limit``: at N = 8, B = 1, fused >= 0.9x ``limit``;
- ``rss vs peft``: at N >= 2, fused's peak resident set <= 1.0x the plain PEFT loop's;
- ``rss vs peft_gc``: at N >= 2, fused's peak <= 1.3x the checkpointed PEFT loop's.
"""

from __future__ import annotations

import json
import sys

BEST, LIMIT, PEFT_MANY, RSS = 1.0, 0.9, 1.3, 1.3
# Issue 45 (real vocabularies): vs the faster PEFT loop, vs limit, peak RSS vs peft and peft_gc.
REAL_VOCAB = 100_000
FASTER_PEFT, RSS_PEFT, RSS_PEFT_GC = 1.3, 1.0, 1.3


def checks(p: dict) -> dict[str, bool | None]:
    """Each target's verdict for one point (``None`` where it does not apply)."""
    best = max(p["sliced_tps"], p["peft_tps"])
    rss = p.get("peak_rss_mb")
    return {
        "best": p["fused_tps"] >= BEST * best,
        "limit": p["fused_vs_limit"] >= LIMIT,
        "peft x1.3": (
            p["fused_vs_peft"] >= PEFT_MANY if p["tenants"] >= 4 and p["batch"] == 1 else None
        ),
        "rss": rss["fused"] <= RSS * rss["peft"] if isinstance(rss, dict) else None,
    }


def _ranks(ranks: list[int]) -> str:
    return str(ranks[0]) if len(set(ranks)) == 1 else "/".join(map(str, sorted(set(ranks))))


def render(lines: list[dict]) -> str:
    points = [p for p in lines if "fused_tps" in p]
    head = (
        "| model | N | B | ranks | fused | sliced | peft | limit | fused/best | fused/limit | "
        "fused/peft | RSS fused/peft MB | best | limit | peft x1.3 | rss |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    totals: dict[str, list[int]] = {}
    for p in points:
        verdict = checks(p)
        rss = p.get("peak_rss_mb")
        rss_cell = f"{rss['fused']:.0f}/{rss['peft']:.0f}" if isinstance(rss, dict) else "-"
        best = max(p["sliced_tps"], p["peft_tps"])
        cells = [
            *_point_cells(p),
            f"{p['sliced_tps']:.0f}",
            f"{p['peft_tps']:.0f}",
            f"{p['limit_tps']:.0f}",
            f"{p['fused_tps'] / best:.3f}",
            f"{p['fused_vs_limit']:.3f}",
            f"{p['fused_vs_peft']:.3f}",
            rss_cell,
        ]
        out.append(_verdict_row(cells, verdict, totals, ("yes", "**no**")))
    return "\n".join(out) + f"\n\nTargets met: {_summary(totals)}.\n"


def _verdict_row(
    cells: list, verdict: dict[str, bool | None], totals: dict[str, list[int]], words: tuple
) -> str:
    """One table row: ``cells`` then each verdict as ``words`` (met, unmet), counted into
    ``totals`` (``name -> [met, judged]``)."""
    for name, ok in verdict.items():
        cells.append("" if ok is None else (words[0] if ok else words[1]))
        if ok is not None:
            met, seen = totals.setdefault(name, [0, 0])
            totals[name] = [met + int(ok), seen + 1]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _point_cells(p: dict) -> list:
    """A row's first cells: model, N, B, ranks and fused tokens/s."""
    return [
        p["model"].removeprefix("tiny://"),
        p["tenants"],
        p["batch"],
        _ranks(p["ranks"]),
        f"{p['fused_tps']:.0f}",
    ]


def _summary(totals: dict[str, list[int]]) -> str:
    return ", ".join(f"{name}: {met} of {seen}" for name, (met, seen) in totals.items())


def real_vocab_checks(p: dict) -> dict[str, bool | None]:
    """Issue 45's verdicts for one real-vocabulary point (``None`` where one does not apply)."""
    n8_b1 = p["tenants"] == 8 and p["batch"] == 1
    faster = max(p["peft_tps"], p["peft_gc_tps"])
    rss = p.get("peak_rss_mb")
    rss = rss if isinstance(rss, dict) and "peft_gc" in rss and p["tenants"] >= 2 else None
    return {
        "x1.3 faster peft": p["fused_tps"] >= FASTER_PEFT * faster if n8_b1 else None,
        "x0.9 limit": p["fused_vs_limit"] >= LIMIT if n8_b1 else None,
        "rss vs peft": rss["fused"] <= RSS_PEFT * rss["peft"] if rss else None,
        "rss vs peft_gc": rss["fused"] <= RSS_PEFT_GC * rss["peft_gc"] if rss else None,
    }


def render_real_vocab(lines: list[dict]) -> str:
    """Issue 45's table: the real-vocabulary points with both PEFT loops; ``""`` if none."""
    points = [p for p in lines if "peft_gc_tps" in p and (p.get("vocab_size") or 0) >= REAL_VOCAB]
    if not points:
        return ""
    head = (
        "| model | N | B | ranks | fused | peft | peft_gc | limit | fused/faster peft | "
        "fused/limit | RSS fused/peft/peft_gc MB (fused/each) | x1.3 faster peft | x0.9 limit | "
        "rss vs peft | rss vs peft_gc |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    totals: dict[str, list[int]] = {}
    for p in points:
        rss = p.get("peak_rss_mb")
        rss_cell = "-"
        if isinstance(rss, dict) and "peft_gc" in rss:
            rss_cell = (
                f"{rss['fused']:.0f}/{rss['peft']:.0f}/{rss['peft_gc']:.0f} "
                f"({rss['fused'] / rss['peft']:.2f}x/{rss['fused'] / rss['peft_gc']:.2f}x)"
            )
        faster = max(p["peft_tps"], p["peft_gc_tps"])
        cells = [
            *_point_cells(p),
            f"{p['peft_tps']:.0f}",
            f"{p['peft_gc_tps']:.0f}",
            f"{p['limit_tps']:.0f}",
            f"{p['fused_tps'] / faster:.3f}",
            f"{p['fused_vs_limit']:.3f}",
            rss_cell,
        ]
        out.append(_verdict_row(cells, real_vocab_checks(p), totals, ("met", "**unmet**")))
    return (
        "\n".join(out)
        + f"\n\nIssue 45 targets met (real vocabulary): {_summary(totals) or 'none judged'}.\n"
    )


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "-"
    with sys.stdin if path == "-" else open(path) as f:
        lines = [json.loads(line) for line in f if line.strip().startswith("{")]
    print(render(lines), end="")
    real_vocab = render_real_vocab(lines)
    if real_vocab:
        print("\n" + real_vocab, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
