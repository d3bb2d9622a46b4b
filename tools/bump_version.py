"""Set the one Twinkle version everywhere it appears, or check that it is consistent.

The root ``VERSION`` file is the single source. Every distribution's ``pyproject.toml`` (its own
``version`` and the exact pins on its siblings) and every ``_version.py`` are derived from it.

Usage:
    python tools/bump_version.py 0.2.0   # write the new version everywhere
    python tools/bump_version.py --check # exit 1 if any file disagrees with VERSION
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = ("twinkle-client", "twinkle", "twinkle-server")
VERSION_FILES = {
    "twinkle-client": "packages/twinkle-client/src/twinkle_client/_version.py",
    "twinkle": "packages/twinkle/src/twinkle/_version.py",
}
_SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:(?:a|b|rc|\.dev|\.post)\d+)?$")


def _rewrite_pyproject(text: str, version: str) -> str:
    text = re.sub(r'(?m)^version = "[^"]*"', f'version = "{version}"', text, count=1)
    for sibling in DISTRIBUTIONS:
        text = re.sub(rf'"{re.escape(sibling)}==[^"]*"', f'"{sibling}=={version}"', text)
    return text


def _version_module(version: str) -> str:
    return f'"""Written by tools/bump_version.py from the root VERSION file."""\n\n__version__ = "{version}"\n'


def expected_files(version: str) -> dict[Path, str]:
    """Map each derived file to the content it must have for ``version``."""
    files: dict[Path, str] = {}
    for dist in DISTRIBUTIONS:
        path = ROOT / "packages" / dist / "pyproject.toml"
        files[path] = _rewrite_pyproject(path.read_text(), version)
    for rel in VERSION_FILES.values():
        files[ROOT / rel] = _version_module(version)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("version", nargs="?", help="new version, e.g. 0.2.0")
    parser.add_argument("--check", action="store_true", help="only check consistency")
    args = parser.parse_args(argv)
    if args.check == bool(args.version):
        parser.error("give either a version or --check")
    if args.check:
        version = (ROOT / "VERSION").read_text().strip()
        stale = [
            str(p.relative_to(ROOT))
            for p, want in expected_files(version).items()
            if not p.exists() or p.read_text() != want
        ]
        if stale:
            print(f"out of date with VERSION {version}: {', '.join(stale)}", file=sys.stderr)
            return 1
        print(f"all distributions at {version}")
        return 0
    if not _SEMVER.match(args.version):
        parser.error(f"not a version: {args.version!r}")
    (ROOT / "VERSION").write_text(args.version + "\n")
    for path, content in expected_files(args.version).items():
        path.write_text(content)
    print(f"version set to {args.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
