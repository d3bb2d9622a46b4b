"""Keep bench/step_to_sample.py from rotting: one repeat of the local path on the tiny model,
whose correctness part (the in-memory and checkpoint samples are equal) must hold."""

import importlib.util
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "bench" / "step_to_sample.py"


def test_one_repeat_reports_both_modes_and_equal_logprobs(capsys):
    spec = importlib.util.spec_from_file_location("step_to_sample", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        (record,) = bench.main(["--models", "tiny://qwen3", "--paths", "local", "--repeats", "1"])
    finally:
        torch.set_num_threads(threads)  # the bench pins 1 thread; the rest of the run does not
    assert record["logprobs_equal"] is True
    for mode in ("memory", "checkpoint"):
        assert record[mode]["total_median_ms"] > 0
        assert (
            record[mode]["weights_to_sampler_median_ms"]
            == record[mode]["weights_to_sampler_min_ms"]
        )
    assert '"summary"' in capsys.readouterr().out
