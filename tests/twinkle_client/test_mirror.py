"""``twinkle_client`` mirrors ``twinkle``: same public names, same signatures, differences listed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _check_mirror():
    spec = importlib.util.spec_from_file_location(
        "check_mirror", ROOT / "tools" / "check_mirror.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the class
    spec.loader.exec_module(module)
    return module


def test_every_public_name_and_signature_matches_or_is_allowed_with_a_reason():
    check = _check_mirror()
    findings = check.compare()
    mismatches = [f"{f.key}: {f.problem}" for f in findings if f.allowed is None]
    assert mismatches == []
    assert {f.key for f in findings} == set(check.ALLOWED), (
        "ALLOWED lists a difference that is gone"
    )
    assert all(len(reason) > 10 for reason in check.ALLOWED.values())


def test_the_check_catches_a_drifted_signature(monkeypatch):
    check = _check_mirror()
    import twinkle_client.model.multi_lora as remote

    def drifted(self, max_grad_norm: float = 2.0, adapter_name: str | None = None) -> bool:
        return True

    monkeypatch.setattr(remote.MultiLoraTransformersModel, "clip_grad_and_step", drifted)
    keys = {f.key for f in check.compare(("model",)) if f.allowed is None}
    assert "model.MultiLoraTransformersModel.clip_grad_and_step" in keys


def test_the_tool_exits_zero_and_prints_a_report():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_mirror.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 mismatch(es)" in result.stdout and "reason:" in result.stdout


def test_seed_imports_resolve():
    from twinkle import init_twinkle_client
    from twinkle_client import TwinkleClient
    from twinkle_client import init_twinkle_client as direct

    assert init_twinkle_client is direct and TwinkleClient.__name__ == "TwinkleClient"


def test_dataset_encode_takes_timeout_both_ways():
    """The seed's ``dataset.encode(batched=True, num_proc=8, timeout=3600)`` runs with either
    import (locally the timeout is ignored)."""
    import inspect

    from twinkle.dataset import Dataset as Local
    from twinkle_client.dataset import Dataset as Remote

    local, remote = inspect.signature(Local.encode), inspect.signature(Remote.encode)
    assert local == remote
    assert local.parameters["timeout"].default == 600.0
