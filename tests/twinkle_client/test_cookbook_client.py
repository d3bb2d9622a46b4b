"""The client cookbook runs against a live tiny server, configured through its environment only
(TWINKLE_SERVER_URL, TWINKLE_SERVER_TOKEN, TWINKLE_BASE_MODEL=tiny/qwen3.5, TWINKLE_MAX_STEPS) with
the ModelScope cache seeded offline (``ms://tiny/qwen3.5``, ``ms://swift/self-cognition``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cookbook_launch import offline_env
from serving import KEYS, full_server

COOKBOOK = Path(__file__).resolve().parents[2] / "cookbook" / "client" / "twinkle" / "self_host"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    root = tmp_path_factory.mktemp("cookbook")
    with full_server(root, model_id="tiny://qwen3.5", sampler=True) as served:
        yield served[0], offline_env(root)


def _run(script: Path, served, cwd: Path, **env: str) -> str:
    url, seeded = served
    env = {
        **seeded,
        "TWINKLE_SERVER_URL": url,
        "TWINKLE_SERVER_TOKEN": KEYS["alice"],
        "TWINKLE_BASE_MODEL": "tiny/qwen3.5",
        **env,
    }
    result = subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def test_self_cognition_is_the_seed_example(qwen35, tmp_path):
    source = (COOKBOOK / "self_cognition.py").read_text()
    # The seed's values are the defaults; the environment points the script at the tiny server.
    assert all(
        default in source
        for default in ("http://localhost:8000", "EMPTY_API_KEY", "Qwen/Qwen3.5-4B")
    )
    out = _run(COOKBOOK / "self_cognition.py", qwen35, tmp_path, TWINKLE_MAX_STEPS="8")
    assert (
        "- tiny/qwen3.5" in out
        and "Saved checkpoint: twinkle://" in out
        and "twinkle-epoch-2" in out
    )
    # A second run (the seed's spelling) finds the first run's checkpoints (the resume flow's
    # Step 2).
    out = _run(COOKBOOK / "self_congnition.py", qwen35, tmp_path, TWINKLE_MAX_STEPS="2")
    assert '"twinkle_path"' in out


def test_dpo_sample_and_grpo(qwen35, tmp_path):
    out = _run(COOKBOOK / "dpo.py", qwen35, tmp_path, TWINKLE_MAX_STEPS="4")
    assert "dpo step 4" in out and "saved: twinkle://" in out
    out = _run(COOKBOOK / "sample.py", qwen35, tmp_path)
    assert "== base model" in out and "== adapter twinkle://" in out
    out = _run(
        COOKBOOK / "short_math_grpo.py",
        qwen35,
        tmp_path,
        TWINKLE_WARMUP_STEPS="5",
        TWINKLE_MAX_STEPS="2",
    )
    assert "grpo step 2: mean reward" in out


def test_modelscope_scripts_need_the_hosted_address_and_a_token(tmp_path):
    script = COOKBOOK.parent / "modelscope" / "dpo.py"
    env = {
        k: v for k, v in os.environ.items() if k not in ("TWINKLE_SERVER_URL", "MODELSCOPE_TOKEN")
    }
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0 and "set TWINKLE_SERVER_URL" in result.stderr


def test_modelscope_script_runs_the_self_host_one(qwen35, tmp_path):
    out = _run(
        COOKBOOK.parent / "modelscope" / "dpo.py",
        qwen35,
        tmp_path,
        MODELSCOPE_TOKEN=KEYS["bob"],
        TWINKLE_MAX_STEPS="1",
    )
    assert "dpo step 1" in out and "saved: twinkle://" in out
