"""Older official SDKs pass the same SDK suite (issue 27: 0.27.0 and 0.33.0; issue 44: 0.16.1, the
version ModelScope Twinkle pins), each in its own venv.

0.38.0, the SDK the server pins, is the default run. This slow-tier test runs
tools/run_tinker_sdk_versions.sh for the older versions; it builds .venv-tinker-<V> the first time
(``pip install tinker==V``), which needs the package index.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("version", ["0.16.1", "0.27.0", "0.33.0"])
def test_the_sdk_suite_passes_under_an_older_sdk(version):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    run = subprocess.run(
        [str(ROOT / "tools" / "run_tinker_sdk_versions.sh"), version],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
