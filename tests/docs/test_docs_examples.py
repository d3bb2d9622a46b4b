"""The documentation stays true: its marked examples run, and its relative links resolve.

A python block runs when the line just before its fence is ``<!-- test: run -->``. Each runs in a
fresh interpreter in a temporary directory, with checkpoints going there and no hub access.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLE_DOCS = ("training.md", "checkpoints.md")
RUN_MARKER = "<!-- test: run -->"
# Pages other engineers are still writing: a link to them is skipped only while they do not exist.
PENDING_DOCS = {DOCS / "performance.md", DOCS / "sampling.md"}

_FENCE = re.compile(r"^```")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")


def marked_examples(doc: Path) -> list[tuple[int, str]]:
    """``(line number, code)`` of every python block right after a ``RUN_MARKER`` line."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    examples = []
    for i, line in enumerate(lines[:-1]):
        if line.strip() != RUN_MARKER:
            continue
        if lines[i + 1].strip() != "```python":
            raise AssertionError(f"{doc.name}:{i + 1}: {RUN_MARKER} must precede a ```python fence")
        end = next(j for j in range(i + 2, len(lines)) if _FENCE.match(lines[j]))
        examples.append((i + 3, "\n".join(lines[i + 2 : end]) + "\n"))
    return examples


def _examples() -> dict[str, str]:
    """``{'<doc>:<line>': code}`` for every marked example of ``EXAMPLE_DOCS``."""
    return {
        f"{name}:{line}": code
        for name in EXAMPLE_DOCS
        for line, code in marked_examples(DOCS / name)
    }


@pytest.mark.parametrize("doc", EXAMPLE_DOCS)
def test_every_example_doc_has_marked_examples(doc):
    assert marked_examples(DOCS / doc), f"{doc} has no {RUN_MARKER} example"


@pytest.fixture(scope="module")
def started_examples(tmp_path_factory):
    """Every marked example started at once, each in its own interpreter and directory.

    They run side by side (most of their time is importing torch and transformers); one torch
    thread each keeps them from fighting over the cores.
    """
    processes = {}
    for key, code in _examples().items():
        workdir = tmp_path_factory.mktemp("example")
        (workdir / "example.py").write_text(code, encoding="utf-8")
        env = {
            **os.environ,
            "TWINKLE_OUTPUT_DIR": str(workdir),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
        }
        # Output goes to a file, not a pipe: a full pipe would stall an example nobody reads yet.
        with open(workdir / "output.txt", "w") as output:
            process = subprocess.Popen(
                [sys.executable, "example.py"],
                cwd=workdir,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        processes[key] = (process, workdir / "output.txt")
    yield processes
    for process, _ in processes.values():
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.integration
@pytest.mark.parametrize("key", list(_examples()))
def test_marked_example_runs(key, started_examples):
    process, output = started_examples[key]
    returncode = process.wait(timeout=300)
    assert returncode == 0, f"example {key} failed:\n{output.read_text(errors='replace')[-4000:]}"


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _prose(text: str, keep_inline_code: bool = False) -> str:
    """The text outside fenced code blocks (and inline code), where links are real links."""
    kept, in_fence = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            kept.append(line if keep_inline_code else _INLINE_CODE.sub("", line))
    return "\n".join(kept)


def relative_links(doc: Path) -> list[tuple[Path, str]]:
    """``(target file, anchor)`` of every relative link in ``doc``; ``anchor`` may be empty."""
    links = []
    for target in _LINK.findall(_prose(doc.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        links.append(((doc.parent / path).resolve() if path else doc.resolve(), anchor))
    return links


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in _prose(doc.read_text(encoding="utf-8"), keep_inline_code=True).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            anchors.add(re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: p.name)
def test_relative_links_point_to_existing_files(doc):
    broken = []
    for target, _ in relative_links(doc):
        if target.exists() or target in PENDING_DOCS:
            continue
        broken.append(str(target.relative_to(ROOT)) if target.is_relative_to(ROOT) else str(target))
    assert not broken, f"{doc.name} links to missing files: {broken}"


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: p.name)
def test_anchors_of_links_into_markdown_exist(doc):
    broken = [
        f"{target.name}#{anchor}"
        for target, anchor in relative_links(doc)
        if anchor and target.suffix == ".md" and target.exists() and anchor not in _anchors(target)
    ]
    assert not broken, f"{doc.name} links to missing headings: {broken}"
