"""bench/ and tools/ import what exists: their siblings, the standard library or an installed
package, never a module of tests/ (what they share with the tests lives in
``twinkle.server.testing``). import-linter cannot see an import that resolves nowhere, such as a
module reached only through a ``sys.path`` edit, so this walks the scripts' imports itself."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("folder", ["bench", "tools"])
def test_every_import_of_the_scripts_resolves_without_tests(folder):
    scripts = sorted((ROOT / folder).glob("*.py"))
    siblings = {p.stem for p in scripts}
    unresolved = []
    for path in scripts:
        text = path.read_text()
        assert "tests" not in "".join(
            line for line in text.splitlines() if "sys.path" in line
        ), f"{path.name} puts tests/ on sys.path"
        for line, name in _imports(path):
            top = name.split(".")[0]
            if top in siblings or top in sys.stdlib_module_names:
                continue
            if top == "tests" or importlib.util.find_spec(top) is None:
                unresolved.append(f"{path.name}:{line}: {name}")
    assert unresolved == []
