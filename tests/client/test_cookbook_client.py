"""The client cookbook runs against a live tiny server, changed only in base model and data set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from serving import KEYS, full_server

COOKBOOK = Path(__file__).resolve().parents[2] / "cookbook" / "client" / "twinkle" / "self_host"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    with full_server(
        tmp_path_factory.mktemp("cookbook"), model_id="tiny://qwen3.5", sampler=True
    ) as served:
        yield served[0]


def _run(script: Path, url: str, cwd: Path, **env: str) -> str:
    env = {**os.environ, "TWINKLE_SERVER_URL": url, "TWINKLE_SERVER_TOKEN": KEYS["alice"], **env}
    result = subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def test_self_cognition_is_the_seed_example(qwen35, tmp_path):
    source = (COOKBOOK / "self_cognition.py").read_text()
    # The seed hard-codes its server and key; point them at the test server, nothing else.
    assert "http://localhost:8000" in source and "EMPTY_API_KEY" in source
    script = tmp_path / "self_cognition.py"
    script.write_text(
        source.replace("http://localhost:8000", qwen35).replace("EMPTY_API_KEY", KEYS["alice"])
    )
    out = _run(script, qwen35, tmp_path)
    assert (
        "- tiny/qwen3.5" in out
        and "Saved checkpoint: twinkle://" in out
        and "twinkle-epoch-2" in out
    )
    # A second run finds the first run's checkpoints (the resume flow's Step 2).
    assert '"twinkle_path"' in _run(script, qwen35, tmp_path)


def test_dpo_sample_and_grpo(qwen35, tmp_path):
    out = _run(COOKBOOK / "dpo.py", qwen35, tmp_path, DPO_STEPS="4")
    assert "dpo step 4" in out and "saved: twinkle://" in out
    out = _run(COOKBOOK / "sample.py", qwen35, tmp_path)
    assert "== base model" in out and "== adapter twinkle://" in out
    out = _run(COOKBOOK / "short_math_grpo.py", qwen35, tmp_path, WARMUP_STEPS="5", GRPO_STEPS="2")
    assert "grpo step 2: mean reward" in out
