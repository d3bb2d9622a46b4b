"""The architecture contracts of ``.importlinter`` hold (import-linter, over the merged tree), the
cycle check finds cycles, and the model service is what its operation handlers are typed against."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from check_architecture import find_cycles  # noqa: E402

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
    assert result.stdout.count(" KEPT") == contracts == 14


def _graph(*imports: str) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for line in imports:
        importer, imported = line.split(" -> ")
        graph.add_import(importer=importer, imported=imported)
    return graph


def test_the_cycle_check_reports_one_shortest_cycle_per_group():
    graph = _graph(
        "p.a -> p.b",
        "p.b -> p.c",
        "p.c -> p.a",
        "p.c -> p.b",  # a shorter cycle inside the same group: b -> c -> b
        "p.x -> p.y",
        "p.y -> p.x",
        "p.d -> p.a",  # d only imports into the group: not on a cycle
        "q.out -> p.x",
    )
    modules = {m for m in graph.modules if m.startswith("p.")}
    assert find_cycles(graph, modules) == [("p.b", "p.c"), ("p.x", "p.y")]


def test_the_cycle_check_ignores_cycles_outside_the_packages_and_passes_a_dag():
    graph = _graph("p.a -> p.b", "p.b -> p.c", "p.a -> p.c", "q.a -> q.b", "q.b -> q.a")
    assert find_cycles(graph, {"p.a", "p.b", "p.c"}) == []
    assert find_cycles(graph, {"q.a", "q.b"}) == [("q.a", "q.b")]


def test_the_model_service_is_the_host_its_handlers_are_typed_against(tmp_path):
    from twinkle.model.mock import MockModel
    from twinkle.server.model.host import ModelHost
    from twinkle.server.model.registry import StateRunRegistry
    from twinkle.server.model.service import ModelService
    from twinkle.server.state import MemoryStore, ServerState

    registry = StateRunRegistry(ServerState(MemoryStore("host:")), tmp_path)
    service = ModelService(MockModel("tiny/qwen3", vocab_size=64), "tiny/qwen3", registry)
    assert isinstance(service, ModelHost)
    for name in ("entry", "adapter_added", "adapter_removed"):
        expected = list(inspect.signature(getattr(ModelHost, name)).parameters)
        assert list(inspect.signature(getattr(ModelService, name)).parameters) == expected, name
