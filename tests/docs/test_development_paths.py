"""docs/development.md names files as it walks a request from the client to the kernel and back,
and draws the server package's layout: every file and folder it names there exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "development.md"
SERVER = ROOT / "packages/twinkle-server/src/twinkle/server"
#: Where a short path in the page starts: ``twinkle/...``, ``twinkle_client/...``,
#: ``server/...`` (the server package), ``twinkle-server/.../server/...``, or the repository.
BASES = (
    ROOT,
    ROOT / "packages/twinkle/src",
    ROOT / "packages/twinkle-client/src",
    ROOT / "packages/twinkle-server/src/twinkle",
)
PATH = re.compile(r"`([\w./-]+/[\w.-]+\.py|[\w./-]+/)`")

pytestmark = pytest.mark.unit


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_every_path_of_the_request_flow_exists():
    named = [p.split(".../")[-1] for p in PATH.findall(_section("How a request flows"))]
    assert len(named) > 30  # the walk names the files of every hop
    missing = [p for p in named if not any((base / p).exists() for base in BASES)]
    assert missing == []


def test_the_server_layout_names_every_subpackage_and_only_existing_ones():
    block = _section("Repository layout").split("The server package")[1]
    drawn = set(re.findall(r"^([a-z_]+)/ ", block, re.M)) | set(
        re.findall(r";\s+([a-z_]+)/ ", block)
    )
    actual = {p.name for p in SERVER.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert drawn == actual
