"""The repository's layout rules: ``bench/`` and ``tools/`` import the packages (never ``tests/``,
never each other through ``sys.path``), and the tests of each distribution mirror its modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit

# Where each distribution's tests live, and the source folder they mirror.
DISTRIBUTIONS = {
    "twinkle": ROOT / "packages" / "twinkle" / "src" / "twinkle",
    "twinkle_server": ROOT / "packages" / "twinkle-server" / "src" / "twinkle" / "server",
    "twinkle_client": ROOT / "packages" / "twinkle-client" / "src" / "twinkle_client",
}

# Test folders that are no single module of their distribution, with the reason.
ALLOWED_FOLDERS = {
    "twinkle/data": "the data pipeline as a whole: data_format, dataset, dataloader, preprocessor, "
    "processor and template are tested together, rows through to token ids",
    "twinkle/multimodal": "the image path end to end: template, dataset, the model's vision step, "
    "the sampler, and the server and client that carry images",
}


def _scripts(folder: str) -> list[Path]:
    return sorted((ROOT / folder).glob("*.py"))


def _is_sys_path(node: ast.AST) -> bool:
    """``sys.path`` itself, or an item or slice of it."""
    if isinstance(node, ast.Subscript):
        node = node.value
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _path_edits(tree: ast.AST) -> list[int]:
    """Lines that change ``sys.path``: a call of one of its methods, or an assignment to it."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if _is_sys_path(node.func.value):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_sys_path(target) for target in targets):
                lines.append(node.lineno)
    return sorted(lines)


def _imported_roots(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, first name) of every absolute import."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.append((node.lineno, node.module.split(".")[0]))
    return sorted(roots)


@pytest.mark.parametrize("folder", ["bench", "tools"])
def test_bench_and_tools_import_the_packages_not_tests_nor_each_other(folder):
    other = "tools" if folder == "bench" else "bench"
    own = {path.stem for path in _scripts(folder)}
    # A module of the other folder is importable only through a sys.path edit.
    foreign = {path.stem for path in _scripts(other)} - own
    problems = []
    for path in _scripts(folder):
        tree = ast.parse(path.read_text(), filename=str(path))
        name = path.relative_to(ROOT)
        problems += [f"{name}:{line}: edits sys.path" for line in _path_edits(tree)]
        for line, root in _imported_roots(tree):
            if root == "tests":
                problems.append(f"{name}:{line}: imports tests")
            elif root in foreign:
                problems.append(f"{name}:{line}: imports {other}/{root}.py")
    assert problems == []


def test_the_rules_see_what_they_forbid():
    tree = ast.parse(
        "import sys\n"
        "sys.path.insert(0, 'tests/twinkle_server')\n"
        "sys.path[:0] = ['bench']\n"
        "sys.path += ['tools']\n"
        "from tests.twinkle.model.conftest import make_batch\n"
        "import os.path\n"
        "os.path.join('a', 'b')\n"
    )
    assert _path_edits(tree) == [2, 3, 4]
    assert [root for _, root in _imported_roots(tree)] == ["sys", "tests", "os"]


def _module_exists(source: Path, relative: Path) -> bool:
    target = source.joinpath(*relative.parts)
    return target.is_dir() or target.with_suffix(".py").is_file()


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_each_test_folder_mirrors_a_module_of_its_distribution(distribution):
    source = DISTRIBUTIONS[distribution]
    tests = ROOT / "tests" / distribution
    assert tests.is_dir()
    folders = {
        path.parent.relative_to(tests)
        for path in tests.rglob("*.py")
        if "__pycache__" not in path.parts
    }
    stray = [
        f"tests/{distribution}/{folder.as_posix()}"
        for folder in sorted(folders)
        if folder.parts
        and not _module_exists(source, folder)
        and f"{distribution}/{folder.as_posix()}" not in ALLOWED_FOLDERS
    ]
    assert stray == [], "a test folder names no module (move it, or allow it with a reason)"


def test_the_allowlist_holds_only_folders_that_exist_and_name_no_module():
    for entry in ALLOWED_FOLDERS:
        distribution, _, folder = entry.partition("/")
        assert (ROOT / "tests" / entry).is_dir(), entry
        assert not _module_exists(DISTRIBUTIONS[distribution], Path(folder)), entry


def test_only_the_cross_cutting_suites_sit_beside_the_distributions():
    top = {path.name for path in (ROOT / "tests").iterdir() if path.is_dir()} - {"__pycache__"}
    assert top == set(DISTRIBUTIONS) | {
        "bench",
        "contract",
        "docs",
        "packaging",
        "reliability",
        "tinker_cookbook",
    }
