"""Which points the training benchmark (bench/multi_tenant_train.py) runs: models, tenant counts,
batch sizes and ranks, and how many rounds each gets."""

from __future__ import annotations

from dataclasses import dataclass

MODELS = ("tiny://qwen3.5", "tiny://qwen3.5-25m")
# --real-vocab: the 25M body with Qwen3's real vocabulary (151,936 embedding rows).
REAL_VOCAB_MODELS = ("tiny://qwen3-25m-vocab",)
TENANTS = (1, 2, 4, 8)
BATCHES = (1, 4)
MIXED_RANKS = (8, 16, 32, 64)
# Many-tenant points (--many-tenants): B=1, ranks cycling 8/16/32 (the issue-29 harness's mix).
MANY_TENANTS = (32, 64, 128)
MANY_RANKS = (8, 16, 32)
RANK = 16
SEQ = 128


@dataclass(frozen=True)
class Point:
    model: str
    ranks: tuple[int, ...]
    batch: int
    seq: int = SEQ

    @property
    def tenants(self) -> int:
        return len(self.ranks)


# --quick: one warm-up round and a 6 s budget per point (15 or more timed rounds on the tiny
# model), so the four points take about 30 s and their medians still mean something.
QUICK_WARMUP = 1
QUICK_POINT_SECONDS = 6.0


def schedule(
    quick: bool, warmup: int, steps: int | None, point_seconds: float
) -> tuple[int, int | None, float]:
    """``(warmup, steps, budget_seconds)`` for every point; ``--steps`` always wins."""
    if quick:
        return QUICK_WARMUP, steps, min(point_seconds, QUICK_POINT_SECONDS)
    return warmup, steps, point_seconds


def many_ranks(n: int) -> tuple[int, ...]:
    """``n`` tenants' ranks, cycling through ``MANY_RANKS``."""
    return tuple(MANY_RANKS[i % len(MANY_RANKS)] for i in range(n))


def points(
    quick: bool,
    models: list[str] | None = None,
    tenants: list[int] | None = None,
    batches: list[int] | None = None,
    many: bool = False,
    real_vocab: bool = False,
) -> list[Point]:
    """The points to run; ``tenants`` / ``batches`` keep only those N / B (the mixed-rank row
    has N = len(MIXED_RANKS)). The many-tenant points (N in ``MANY_TENANTS``, B=1, ranks from
    ``many_ranks``) come after the others with ``many``, or when ``tenants`` names their N.
    ``real_vocab`` adds ``REAL_VOCAB_MODELS`` after ``models`` (default ``MODELS``); ``quick``
    runs the first of ``models`` and, with ``real_vocab``, those too."""
    extra = [m for m in REAL_VOCAB_MODELS if m not in (models or ())] if real_vocab else []
    if quick:
        quick_models = [(models or MODELS)[0], *extra]
        out = [Point(m, (RANK,) * n, b) for m in quick_models for n in (1, 8) for b in BATCHES]
    else:
        models = [*(models or MODELS), *extra]
        out = []
        for model in models:
            for b in BATCHES:
                out += [Point(model, (RANK,) * n, b) for n in TENANTS]
                out.append(Point(model, MIXED_RANKS, b))
        for model in models:
            out += [
                Point(model, many_ranks(n), 1)
                for n in MANY_TENANTS
                if many or (tenants is not None and n in tenants)
            ]
    return [
        p
        for p in out
        if (tenants is None or p.tenants in tenants) and (batches is None or p.batch in batches)
    ]
