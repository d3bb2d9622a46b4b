"""The architecture contracts of ``.importlinter`` hold (import-linter, over the merged tree)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.unit


def test_import_contracts_are_kept():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools/check_architecture.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
    # Every contract of the file was checked (a renamed module fails instead of passing unseen).
    contracts = (ROOT / ".importlinter").read_text().count("[importlinter:contract:")
    assert result.stdout.count(" KEPT") == contracts == 6
