"""bench/gpu_checks.sh and bench/gpu_summary.py: the one-shot GPU measurement script.

The GPU itself is not here; these tests check what can be checked on a CPU: the script stops
cleanly without CUDA, and the summary reads the targets from the files the script writes.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def summary():
    spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / "bench" / "gpu_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_line(model, batch, fused_vs_sliced, fused_vs_limit=0.97):
    return json.dumps(
        {
            "model": model,
            "tenants": 8,
            "batch": batch,
            "fused_vs_sliced": fused_vs_sliced,
            "fused_vs_limit": fused_vs_limit,
        }
    )


def test_summary_reads_every_target(summary, tmp_path):
    (tmp_path / "train_qwen3.5-25m.log").write_text(
        "\n".join(
            [
                '{"meta": {"threads": 16}}',
                "Loading weights: 100%",
                _train_line("tiny://qwen3.5-25m", 1, 3.1),
                _train_line("tiny://qwen3.5-25m", 4, 1.7),
            ]
        )
    )
    (tmp_path / "train_qwen3-0.5b.log").write_text(
        "\n".join(
            [
                _train_line("tiny://qwen3-0.5b", 1, 2.4),
                '{"model": "tiny://qwen3-0.5b", "tenants": 8, "bat',  # cut off by a time limit
            ]
        )
    )
    (tmp_path / "lora_kernel.jsonl").write_text(
        "\n".join(
            json.dumps(
                {"hidden": h, "tokens": 4096, "ranks": [8, 16], "ratio": r, "target_ratio": 1.15}
            )
            for h, r in ((1024, 1.31), (4096, 1.08))
        )
    )
    rows = summary.summarize(tmp_path)
    train = {(r["model"], r["batch"]): (r["value"], r["met"]) for r in rows if "model" in r}
    assert train == {
        ("tiny://qwen3.5-25m", 1): (3.1, True),
        ("tiny://qwen3.5-25m", 4): (1.7, False),
        ("tiny://qwen3-0.5b", 1): (2.4, True),
        ("tiny://qwen3-0.5b", 4): (None, None),  # not measured: no verdict
    }
    kernel = [(r["hidden"], r["value"], r["met"]) for r in rows if "hidden" in r]
    assert kernel == [(1024, 1.31, False), (4096, 1.08, True)]


def test_summary_of_an_empty_directory_has_no_verdicts(summary, tmp_path, capsys):
    assert summary.main([str(tmp_path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 5 and all(r["met"] is None for r in rows)
    assert summary.main([]) == 2


def test_models_option_lists_what_the_summary_reads(summary, capsys):
    assert summary.main(["--models"]) == 0
    assert capsys.readouterr().out.split() == ["tiny://qwen3-0.5b", "tiny://qwen3.5-25m"]
    assert tuple(summary.MODELS) == ("tiny://qwen3-0.5b", "tiny://qwen3.5-25m")


def test_script_stops_cleanly_without_cuda(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would start measuring")
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", "bench/gpu_checks.sh", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no CUDA device" in (tmp_path / "summary.txt").read_text()
    env_txt = (tmp_path / "env.txt").read_text()
    assert "torch " in env_txt and "cuda False" in env_txt
