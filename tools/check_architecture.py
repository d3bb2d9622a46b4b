"""Check the import-linter contracts in ``.importlinter`` over the whole monorepo.

``twinkle`` is one namespace spread over two distributions (``twinkle`` and ``twinkle-server``);
import-linter reads one directory per package, so the sources are first copied into one tree.

Usage: python tools/check_architecture.py [ROOT]   (ROOT: a checkout, default this one)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def merged_tree(root: Path, into: Path) -> None:
    """``into/twinkle`` (library + server) and ``into/twinkle_client``, Python files only."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    src = root / "packages"
    shutil.copytree(src / "twinkle/src/twinkle", into / "twinkle", ignore=ignore)
    shutil.copytree(
        src / "twinkle-server/src/twinkle/server", into / "twinkle/server", ignore=ignore
    )
    shutil.copytree(
        src / "twinkle-client/src/twinkle_client", into / "twinkle_client", ignore=ignore
    )


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
    config = Path(__file__).resolve().parents[1] / ".importlinter"
    lint = shutil.which("lint-imports")
    if lint is None:
        print("lint-imports not found: pip install import-linter", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        merged_tree(root, Path(tmp))
        env = {**os.environ, "PYTHONPATH": tmp}
        return subprocess.call([lint, str(config), "--no-cache"], cwd=tmp, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
