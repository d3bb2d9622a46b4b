"""Keep bench/multi_tenant_train.py from rotting: its --check mode (fused == sliced, peft ==
fused) runs in CI, and so do the parts that pick its points."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
BENCH = BENCH_DIR / "multi_tenant_train.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH_DIR))  # it imports its private modules as siblings
    try:
        spec = importlib.util.spec_from_file_location("multi_tenant_train", BENCH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH_DIR))
    return module


def test_check_mode_fused_losses_equal_sliced(bench):
    losses = bench.check()
    assert sorted(losses) == ["t0", "t1", "t2"]
    # Random B matrices: every tenant's adapter moves its loss, so the losses differ.
    assert len({round(v, 6) for v in losses.values()}) == 3


def test_check_cli_prints_ok(bench, capsys):
    assert bench.main(["--check", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert '"check": "ok"' in out and '"peft_first_step"' in out
    line = json.loads(out.strip().splitlines()[-1])
    for losses in line["peft_first_step"].values():
        assert set(losses) == {"fused", "peft", "peft_gc"}
        assert abs(losses["peft_gc"] - losses["fused"]) <= 1e-5 * abs(losses["fused"])


def test_quick_subset_is_tiny_model_only(bench):
    points = bench.points(quick=True)
    assert {p.model for p in points} == {"tiny://qwen3.5"}
    assert {(p.tenants, p.batch) for p in points} == {(1, 1), (1, 4), (8, 1), (8, 4)}


def test_real_vocab_adds_the_real_vocabulary_model_after_the_others(bench):
    assert bench.REAL_VOCAB_MODELS == ("tiny://qwen3-25m-vocab",)
    both = bench.points(quick=False, real_vocab=True)
    assert len(both) == 30  # the 20 standard points, then the same 10 on the real vocabulary
    assert both[:20] == bench.points(quick=False)
    assert {p.model for p in both[20:]} == {"tiny://qwen3-25m-vocab"}
    # With --models, after those; named already: not twice.
    n8 = bench.points(quick=False, models=["tiny://qwen3-25m"], tenants=[8], real_vocab=True)
    assert [(p.model, p.batch) for p in n8] == [
        ("tiny://qwen3-25m", 1),
        ("tiny://qwen3-25m", 4),
        ("tiny://qwen3-25m-vocab", 1),
        ("tiny://qwen3-25m-vocab", 4),
    ]
    named = bench.points(quick=False, models=["tiny://qwen3-25m-vocab"], real_vocab=True)
    assert len(named) == 10
    quick = bench.points(quick=True, batches=[1], real_vocab=True)
    assert [(p.model, p.tenants) for p in quick] == [
        ("tiny://qwen3.5", 1),
        ("tiny://qwen3.5", 8),
        ("tiny://qwen3-25m-vocab", 1),
        ("tiny://qwen3-25m-vocab", 8),
    ]


def test_quick_runs_are_time_budgeted_not_a_fixed_few_steps(bench):
    # Budgeted: run_point picks 15-60 timed rounds to fill the budget (3 fixed steps were noise).
    assert bench.schedule(True, 2, None, 10.0) == (1, None, 6.0)
    assert bench.schedule(True, 2, None, 3.0) == (1, None, 3.0)  # a smaller budget is kept
    assert bench.schedule(True, 2, 5, 10.0) == (1, 5, 6.0)  # --steps wins
    assert bench.schedule(False, 2, None, 10.0) == (2, None, 10.0)


def test_tenant_and_batch_filters_keep_only_those_points(bench):
    everything = bench.points(quick=False)
    assert len(everything) == 20  # 2 models x 2 batches x (4 tenant counts + the mixed row)
    n8 = bench.points(quick=False, models=["tiny://qwen3-0.5b"], tenants=[8])
    assert [(p.model, p.tenants, p.batch, set(p.ranks)) for p in n8] == [
        ("tiny://qwen3-0.5b", 8, 1, {16}),
        ("tiny://qwen3-0.5b", 8, 4, {16}),
    ]
    mixed_b1 = bench.points(quick=False, tenants=[4], batches=[1])
    assert sorted(len(set(p.ranks)) for p in mixed_b1) == [1, 1, 4, 4]  # rank 16 x4, mixed
    assert bench.points(quick=False, tenants=[3]) == []


def test_cli_rejects_a_filter_that_matches_nothing(bench, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("no point may run when the filter matches nothing")

    monkeypatch.setattr(bench, "run_point", must_not_run)
    with pytest.raises(SystemExit) as info:
        bench.main(["--tenants", "3"])
    assert info.value.code == 2
    assert "no benchmark point matches" in capsys.readouterr().err


def test_timed_steps_fill_the_budget_within_bounds(bench):
    assert bench.timed_steps(0.1, 10.0, low=15, high=60) == 60
    assert bench.timed_steps(0.3, 10.0, low=15, high=60) == 33
    assert bench.timed_steps(2.0, 10.0, low=15, high=60) == 15
    assert bench.timed_steps(0.0, 10.0, low=15, high=60) == 60


def test_a_point_without_a_step_count_sizes_itself(bench):
    point = bench.Point("tiny://qwen3.5", (16,), batch=1, seq=16)
    result = bench.run_point(point, warmup=0, steps=None, budget_seconds=0.0)
    assert result["steps"] == 15  # a zero budget gives the lower bound
    assert result["fused_tps"] > 0 and result["limit_tps"] > 0 and result["sliced_tps"] > 0
    assert result["fused_vs_limit"] == pytest.approx(
        result["fused_tps"] / result["limit_tps"], abs=2e-3
    )
    assert result["limit_vs_sliced"] == pytest.approx(
        result["limit_tps"] / result["sliced_tps"], abs=2e-3
    )
    assert result["peft_tps"] > 0 and result["peft_gc_tps"] > 0
    assert result["fused_vs_peft"] == pytest.approx(
        result["fused_tps"] / result["peft_tps"], abs=2e-3
    )
    assert result["fused_vs_peft_gc"] == pytest.approx(
        result["fused_tps"] / result["peft_gc_tps"], abs=2e-3
    )
    assert result["vocab_size"] == 4096
    assert "peak_rss_mb" not in result  # no memory processes unless asked (rss=)
    assert "rss_fused_vs_peft" not in result and "rss_fused_vs_peft_gc" not in result
    # The host probe, before and after the timed rounds.
    assert len(result["small_gemm_us"]) == 2 and len(result["small_gemm_us_one_thread"]) == 2
    assert all(v > 0 for v in result["small_gemm_us"] + result["small_gemm_us_one_thread"])


def test_the_host_probe_restores_the_thread_count(bench):
    import torch

    before = torch.get_num_threads()
    probe = bench.small_gemm_us(calls=50)
    assert set(probe) == {"threads", "one_thread"}
    assert probe["threads"] > 0 and probe["one_thread"] > 0
    assert torch.get_num_threads() == before
