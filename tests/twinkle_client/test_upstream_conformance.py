"""The conformance tier: our scripts in ModelScope Twinkle's style (cookbook/client/conformance),
each checking its own values, against a live tiny server launched by tools/upstream_scripts.py,
offline, with a loopback ModelScope hub for the upload."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle" / "hub"))

from modelscope_standin import serve_standin  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_conformance_scripts_pass_against_a_live_server(tmp_path):
    from cookbook_launch import require_port_8000

    require_port_8000()
    with serve_standin({"ms-conformance-token": "alice"}) as hub:
        env = {
            **os.environ,
            "MODELSCOPE_ENDPOINT": hub.url,
            "MODELSCOPE_TOKEN": "ms-conformance-token",
            "MODELSCOPE_HOME": str(tmp_path / "modelscope-home"),
        }
        done = subprocess.run(
            [sys.executable, str(REPO / "tools" / "upstream_scripts.py"), "--suite", "conformance",
             "--workdir", str(tmp_path / "work"), "--timeout", "900", "--only", "dpo.py",
             "grpo.py", "sample_logprobs.py", "embedding.py", "multi_modal.py",
             "multi_turn_rollout.py", "upload_to_hub.py"],
            env=env, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        failed = [line for line in lines if "script" in line and line["rc"] != 0]
        assert done.returncode == 0 and not failed, done.stdout[-6000:] + done.stderr[-3000:]
        assert lines[-1]["passed"] == lines[-1]["of"] == 7
        committed = hub.files.get("alice/twinkle-conformance-lora", {})
        assert {"adapter_config.json", "adapter_model.safetensors"} <= set(committed)
