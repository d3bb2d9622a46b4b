"""Check the import-linter contracts in ``.importlinter`` over the whole monorepo.

``twinkle`` is one namespace spread over two distributions (``twinkle`` and ``twinkle-server``);
import-linter reads one directory per package, so the sources are first copied into one tree.
``bench/`` and ``tools/`` are directories of scripts that import their siblings as top-level
modules (the script's directory is on ``sys.path``); the tree holds them as the packages ``bench``
and ``tools``, each sibling import rewritten to its package form, so the contracts see them too.

import-linter has no contract for "no import cycle between any two modules" (``acyclic_siblings``
compares the children of a package, squashed, which is stricter than a module graph without
cycles); :class:`AcyclicContract` adds it as the contract type ``acyclic``, registered in
``.importlinter`` and reported like the others.

Usage: python tools/check_architecture.py [ROOT]   (ROOT: a checkout, default this one)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output
from importlinter.application import contract_utils
from importlinter.application.contract_utils import AlertLevel

TOOLS = Path(__file__).resolve().parent


class AcyclicContract(Contract):
    """No import cycle between any two modules of ``packages`` (descendants included).

    Every import counts: at module level, inside a function, or under ``TYPE_CHECKING`` (a
    cycle that only a lazy import keeps from failing at run time is still a cycle). One
    shortest cycle is reported per group of modules that import each other round, with the
    line of each import.

    Configuration options:
        - packages: The packages whose modules must not import each other round.
        - ignore_imports: Imports left out of the graph (each one listed with its reason).
        - unmatched_ignore_imports_alerting: ``none``, ``warn`` or ``error`` (default) when an
          ignored import no longer exists.
    """

    type_name = "acyclic"

    packages = fields.ListField(subfield=fields.ModuleField())
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)
    unmatched_ignore_imports_alerting = fields.EnumField(AlertLevel, default=AlertLevel.ERROR)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph,
            ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=self.unmatched_ignore_imports_alerting,  # type: ignore[arg-type]
        )
        modules: set[str] = set()
        for package in self.packages:  # type: ignore[attr-defined]
            modules |= {package.name} | graph.find_descendants(package.name)
        cycles = [
            [_import_line(graph, a, b) for a, b in zip(cycle, (*cycle[1:], cycle[0]))]
            for cycle in find_cycles(graph, modules)
        ]
        return ContractCheck(
            kept=not cycles,
            warnings=list(removal.warnings),
            ignored_import_count=removal.ignored_import_count,
            metadata={"cycles": cycles},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            names = [importer for importer, _, _ in cycle]
            output.print_error(f"Import cycle: {' -> '.join([*names, names[0]])}")
            for importer, imported, where in cycle:
                output.print_error(f"- {importer} -> {imported} ({where})", bold=False)
            output.new_line()


def find_cycles(graph: ImportGraph, modules: set[str]) -> list[tuple[str, ...]]:
    """One shortest cycle (``a -> b -> ... -> a``, as ``(a, b, ...)``) per group of
    ``modules`` that import each other round (a strongly connected component)."""
    best: dict[str, tuple[str, ...]] = {}  # module -> shortest cycle through it
    for importer in sorted(modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & modules):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back and set(back) <= modules:
                cycle = (importer, *back[:-1])
                for module in cycle:
                    if module not in best or len(cycle) < len(best[module]):
                        best[module] = cycle
    groups: list[set[str]] = []
    for cycle in best.values():
        touching = [g for g in groups if g & set(cycle)]
        merged = set(cycle).union(*touching)
        groups = [g for g in groups if g not in touching] + [merged]
    return [
        _rotated(min((best[m] for m in group), key=lambda c: (len(c), c)))
        for group in sorted(groups, key=min)
    ]


def _rotated(cycle: tuple[str, ...]) -> tuple[str, ...]:
    start = cycle.index(min(cycle))
    return cycle[start:] + cycle[:start]


def _import_line(graph: ImportGraph, importer: str, imported: str) -> tuple[str, str, str]:
    details = graph.get_import_details(importer=importer, imported=imported)
    where = ", ".join(f"l.{d['line_number']}: {d['line_contents']}" for d in details)
    return importer, imported, where or "import"


def merged_tree(root: Path, into: Path) -> None:
    """``into/twinkle`` (library + server), ``into/twinkle_client``, ``into/bench`` and
``into/tools``, Python files only."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    src = root / "packages"
    shutil.copytree(src / "twinkle/src/twinkle", into / "twinkle", ignore=ignore)
    shutil.copytree(
        src / "twinkle-server/src/twinkle/server", into / "twinkle/server", ignore=ignore
    )
    shutil.copytree(
        src / "twinkle-client/src/twinkle_client", into / "twinkle_client", ignore=ignore
    )
    script_package(root / "bench", into / "bench")
    script_package(root / "tools", into / "tools")


def script_package(scripts: Path, into: Path) -> None:
    """The ``*.py`` scripts of ``scripts`` as the package ``into``, each import of a sibling
    (``import _measure``, ``from _points import X``) rewritten as ``from <package> import ...``."""
    package = into.name
    into.mkdir()
    (into / "__init__.py").write_text("")
    siblings = {path.stem for path in scripts.glob("*.py")}
    names = "|".join(sorted(siblings))
    plain = re.compile(rf"^(\s*)import ({names})\b(.*)$", re.M)
    from_ = re.compile(rf"^(\s*)from ({names}) import ", re.M)
    for path in scripts.glob("*.py"):
        text = plain.sub(rf"\1from {package} import \2\3", path.read_text())
        text = from_.sub(rf"\1from {package}.\2 import ", text)
        (into / path.name).write_text(text)


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else TOOLS.parent).resolve()
    config = TOOLS.parent / ".importlinter"
    lint = shutil.which("lint-imports")
    if lint is None:
        print("lint-imports not found: pip install import-linter", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        merged_tree(root, Path(tmp))
        # ``tools`` too: .importlinter registers ``check_architecture.AcyclicContract``.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(TOOLS)])}
        return subprocess.call([lint, str(config), "--no-cache"], cwd=tmp, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
