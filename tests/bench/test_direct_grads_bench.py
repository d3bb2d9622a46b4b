"""Keep bench/direct_grads.py (the direct weight gradients A/B) from rotting."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH_DIR))  # it imports multi_tenant_train as a sibling
    try:
        spec = importlib.util.spec_from_file_location("direct_grads", BENCH_DIR / "direct_grads.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH_DIR))
    return module


def test_both_settings_give_bit_identical_gradients(bench):
    assert bench.gradients_equal("tiny://qwen3", (8, 16)) is True


def test_a_point_reports_both_settings_and_leaves_the_default_alone(bench):
    from twinkle.model import MultiLoraTransformersModel

    line = bench.run_point("tiny://qwen3", (16, 16), batch=1, rounds=2)
    assert line["tenants"] == 2 and line["rounds"] == 2
    for key in ("fused_ms_direct", "fused_ms_autograd", "limit_ms_direct", "limit_ms_autograd"):
        assert line[key] > 0
    # The ratio is taken before the times are rounded for the line: equal to the rounded
    # times' ratio within that rounding (0.946 against 0.945 on one CI run).
    assert line["fused_vs_limit_direct"] == pytest.approx(
        line["limit_ms_direct"] / line["fused_ms_direct"], abs=2e-3
    )
    # The bench builds one model per setting: the default a new model gets is untouched.
    assert MultiLoraTransformersModel("tiny://qwen3").direct_weight_grads is True
