"""A save killed mid-write (SIGKILL, real process): the previous checkpoint stays loadable and the
leftovers are cleared, whichever moment of the save the kill hits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from twinkle.model import checkpoint as ckpt

# The child replaces ``final`` through the real atomic_directory and stops at ``where``
# ("inside": files staged, no rename yet; "between": the old checkpoint moved aside, the new one
# not yet in place), tells the parent so on stdout, and waits to be killed.
CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from twinkle.model import checkpoint as ckpt

    final, where = Path(sys.argv[1]), sys.argv[2]
    rename = os.rename

    def stop_between(src, dst):
        rename(src, dst)
        if ".old-" in str(dst):
            print("between", flush=True)
            time.sleep(600)

    if where == "between":
        os.rename = stop_between
    with ckpt.atomic_directory(final) as tmp:
        (tmp / ckpt.ADAPTER_WEIGHTS).write_bytes(b"new")
        if where == "inside":
            print("inside", flush=True)
            time.sleep(600)
    """
)


def _kill_save_at(final: Path, where: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(final), where], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == where
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL


def _previous(tmp_path: Path) -> Path:
    final = tmp_path / "run" / "weights" / "step-1"
    final.mkdir(parents=True)
    (final / ckpt.ADAPTER_WEIGHTS).write_bytes(b"old")
    return final


def _leftovers(final: Path) -> list[str]:
    return sorted(p.name for p in final.parent.iterdir() if p.name.startswith("."))


def test_a_save_killed_while_staging_keeps_the_previous_and_its_staging_is_swept(tmp_path):
    final = _previous(tmp_path)
    _kill_save_at(final, "inside")
    assert (ckpt.require_checkpoint(final) / ckpt.ADAPTER_WEIGHTS).read_bytes() == b"old"
    [staging] = _leftovers(final)
    assert staging.startswith(".step-1.tmp-")
    # A fresh staging directory may be a save still running: kept; an hour old: removed.
    assert ckpt.sweep_partial_saves(tmp_path) == []
    later = time.time() + ckpt.PARTIAL_SAVE_AGE_S + 1
    assert ckpt.sweep_partial_saves(tmp_path, now=later) == [final.parent / staging]
    assert _leftovers(final) == []
    assert (final / ckpt.ADAPTER_WEIGHTS).read_bytes() == b"old"


def test_a_save_killed_between_its_renames_gets_the_previous_checkpoint_back(tmp_path):
    final = _previous(tmp_path)
    _kill_save_at(final, "between")
    assert not final.exists()  # the moment the kill hit: old moved aside, new not in place
    names = _leftovers(final)
    assert any(n.startswith(".step-1.old-") for n in names), names
    # Within the rename window nothing is touched (a live save would rename the new one in) ...
    assert ckpt.sweep_partial_saves(tmp_path) == []
    # ... after it, the sweep puts the previous checkpoint back.
    later = time.time() + ckpt.RENAME_WINDOW_S + 1
    assert ckpt.sweep_partial_saves(tmp_path, now=later) == [final]
    assert (ckpt.require_checkpoint(final) / ckpt.ADAPTER_WEIGHTS).read_bytes() == b"old"
    [staging] = _leftovers(final)  # the killed save's new copy, cleared once stale
    assert staging.startswith(".step-1.tmp-")


def test_loading_after_such_a_kill_puts_the_previous_checkpoint_back_itself(tmp_path, monkeypatch):
    """A relaunched server may load it before any sweep has run."""
    final = _previous(tmp_path)
    _kill_save_at(final, "between")
    monkeypatch.setattr(ckpt, "RENAME_WINDOW_S", 0.0)
    assert (ckpt.require_checkpoint(final) / ckpt.ADAPTER_WEIGHTS).read_bytes() == b"old"


def test_a_replacement_in_place_lets_the_sweep_drop_the_old_copy(tmp_path):
    final = _previous(tmp_path)
    (final.parent / ".step-1.old-deadbeef").mkdir()  # a rmtree that never ran
    assert ckpt.sweep_partial_saves(tmp_path) == [final.parent / ".step-1.old-deadbeef"]
    assert _leftovers(final) == []
