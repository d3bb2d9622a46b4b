"""One environment-variable module per distribution, and nothing else reads the environment.

``twinkle.env``, ``twinkle.server.env`` and ``twinkle_client.env`` declare every variable their
distribution reads or sets; docs/configuration.md lists them; booleans have one set of spellings.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import twinkle.env as library_env
import twinkle.server.env as server_env
import twinkle_client.env as client_env

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "packages").glob("*/src/**/*.py"))
ENV_MODULES = {
    ROOT / "packages/twinkle/src/twinkle/env.py",
    ROOT / "packages/twinkle-server/src/twinkle/server/env.py",
    ROOT / "packages/twinkle-client/src/twinkle_client/env.py",
}
CONFIGURATION = ROOT / "docs/configuration.md"
SECTIONS = {
    "twinkle": library_env,
    "twinkle-server": server_env,
    "twinkle-client": client_env,
}
# Methods of os.environ that only change it (setdefault's return value goes unused where used).
WRITES = {"setdefault", "pop", "update", "clear"}


def _environment_reads(tree: ast.AST) -> list[int]:
    """Lines that read the process environment (``os.environ`` other than a write, ``os.getenv``,
    ``from os import environ/getenv``)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "getenv", "environb") for alias in node.names):
                lines.append(node.lineno)
        if not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            continue
        if node.attr in ("getenv", "getenvb", "environb"):
            lines.append(node.lineno)
        elif node.attr == "environ":
            parent = parents[node]
            written = (
                isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store | ast.Del)
            ) or (isinstance(parent, ast.Attribute) and parent.attr in WRITES)
            if not written:
                lines.append(node.lineno)
    return sorted(lines)


def test_the_walk_finds_reads_and_lets_writes_pass():
    source = (
        "import os\nfrom os import getenv\n"
        "a = os.environ.get('X')\nb = os.environ['X']\nc = 'X' in os.environ\n"
        "d = os.getenv('X')\ne = dict(os.environ)\n"
        "os.environ['X'] = '1'\nos.environ.setdefault('X', '1')\nos.environ.pop('X', None)\n"
        "del os.environ['X']\n"
    )
    assert _environment_reads(ast.parse(source)) == [2, 3, 4, 5, 6, 7]


def test_only_the_env_modules_read_the_environment():
    assert len(SOURCES) > 100 and ENV_MODULES <= set(SOURCES)
    reads = {
        f"{path.relative_to(ROOT)}:{line}"
        for path in SOURCES
        if path not in ENV_MODULES
        for line in _environment_reads(ast.parse(path.read_text(encoding="utf-8")))
    }
    assert reads == set(), "read environment variables through the distribution's env module"


def _documented(section: str) -> str:
    text = CONFIGURATION.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    (body,) = [p for p in parts if p.split("\n", 1)[0].strip().strip("`") == section]
    return body


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_declared_variable_is_documented_in_its_section(section):
    table = {
        row.split("|")[1].strip().strip("`")
        for row in _documented(section).splitlines()
        if row.startswith("| `")
    }
    declared = {variable.name for variable in SECTIONS[section].VARIABLES}
    assert declared == table


def test_every_twinkle_variable_in_the_docs_is_declared():
    names = set(re.findall(r"TWINKLE_[A-Z0-9_]*[A-Z0-9]\b", CONFIGURATION.read_text("utf-8")))
    declared = {v.name for module in SECTIONS.values() for v in module.VARIABLES}
    assert names and names - declared == set()


def test_each_module_declares_a_name_once_and_the_server_shares_the_librarys_objects():
    for module in SECTIONS.values():
        names = [variable.name for variable in module.VARIABLES]
        assert len(names) == len(set(names)) and all(v.doc for v in module.VARIABLES)
    library = {variable.name: variable for variable in library_env.VARIABLES}
    for variable in server_env.VARIABLES:
        if variable.name in library:
            assert variable is library[variable.name]


TRUE = ["1", "true", "TRUE", "Yes", "on", " ON "]
FALSE = ["0", "false", "False", "NO", "off", " 0"]


@pytest.mark.parametrize("parse", [library_env.parse_bool, client_env.parse_bool])
def test_boolean_spellings(parse):
    assert [parse("X", v) for v in TRUE] == [True] * len(TRUE)
    assert [parse("X", v) for v in FALSE] == [False] * len(FALSE)
    for bad in ("2", "y", "enabled", "t"):
        with pytest.raises(ValueError, match=r"TWINKLE_X='.*' is not a boolean.*1/true/yes/on"):
            parse("TWINKLE_X", bad)
    assert library_env.TRUE_SPELLINGS == client_env.TRUE_SPELLINGS
    assert library_env.FALSE_SPELLINGS == client_env.FALSE_SPELLINGS


def test_empty_boolean_is_its_default_and_a_string_is_kept_as_written(monkeypatch):
    monkeypatch.setenv("TWINKLE_MALLOC_TUNING", "")
    assert library_env.TWINKLE_MALLOC_TUNING.get() is True
    monkeypatch.setenv("TWINKLE_OUTPUT_DIR", "")
    assert library_env.TWINKLE_OUTPUT_DIR.get() == ""
    monkeypatch.delenv("TWINKLE_OUTPUT_DIR")
    assert library_env.TWINKLE_OUTPUT_DIR.get() == "output"
    assert library_env.TWINKLE_OUTPUT_DIR.raw() is None


def test_defaults_and_overrides(monkeypatch, tmp_path):
    from twinkle.model.options import ExecutionOptions

    for name in ("TWINKLE_MEGATRON_THREADS", "TWINKLE_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert library_env.TWINKLE_MEGATRON_THREADS.get() == 1
    monkeypatch.setenv("TWINKLE_MEGATRON_THREADS", "4")
    assert library_env.TWINKLE_MEGATRON_THREADS.get() == 4
    monkeypatch.setenv("TWINKLE_MEGATRON_THREADS", "four")
    with pytest.raises(ValueError, match="TWINKLE_MEGATRON_THREADS='four' is not a valid int"):
        library_env.TWINKLE_MEGATRON_THREADS.get()

    from twinkle.hub._tiny import cache_root

    assert cache_root() == Path.home() / ".cache" / "twinkle"
    monkeypatch.setenv("TWINKLE_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path

    assert ExecutionOptions.from_env({}).malloc_tuning is True
    options = ExecutionOptions.from_env(
        {"TWINKLE_MALLOC_TUNING": "Off", "TWINKLE_LORA_KERNEL": "TORCH"}
    )
    assert (options.malloc_tuning, options.lora_kernel) == (False, "torch")
    with pytest.raises(ValueError, match="TWINKLE_MALLOC_TUNING"):
        ExecutionOptions.from_env({"TWINKLE_MALLOC_TUNING": "maybe"})


def test_trust_remote_code_has_the_one_set_of_spellings(monkeypatch):
    from twinkle.hub._resolve import trust_remote_code

    monkeypatch.delenv("TWINKLE_TRUST_REMOTE_CODE", raising=False)
    assert trust_remote_code() is False
    # The image-processor loader accepted 1/true only; every reader now takes the same values.
    for value, expected in [("yes", True), ("ON", True), ("1", True), ("off", False), ("0", False)]:
        monkeypatch.setenv("TWINKLE_TRUST_REMOTE_CODE", value)
        assert trust_remote_code() is expected
    monkeypatch.setenv("TWINKLE_TRUST_REMOTE_CODE", "sure")
    with pytest.raises(ValueError, match="TWINKLE_TRUST_REMOTE_CODE='sure'"):
        trust_remote_code()


def test_launch_passes_trust_remote_code_on_as_written(monkeypatch):
    from twinkle.server.process.launch import PROPAGATED_ENV

    assert PROPAGATED_ENV == (library_env.TWINKLE_TRUST_REMOTE_CODE,)
    monkeypatch.setenv("TWINKLE_TRUST_REMOTE_CODE", "Yes")
    assert [(v.name, v.raw()) for v in PROPAGATED_ENV] == [("TWINKLE_TRUST_REMOTE_CODE", "Yes")]


@pytest.fixture
def fresh_interpret_flag():
    library_env.refresh()
    yield
    # The next reader (a kernel test) reads the environment as the rest of the session has it.
    library_env.refresh()


def test_triton_interpret_is_read_once_per_process(monkeypatch, fresh_interpret_flag):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert library_env.triton_interpret() is True
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert library_env.triton_interpret() is True  # the first read holds for the process
    library_env.refresh()
    assert library_env.triton_interpret() is False
    monkeypatch.delenv("TRITON_INTERPRET")
    library_env.refresh()
    assert library_env.triton_interpret() is False


def test_the_kernel_asks_the_env_module():
    pytest.importorskip("torch")
    from twinkle.model.lora import triton_kernel

    assert triton_kernel.triton_interpret is library_env.triton_interpret


def test_server_accessors(monkeypatch):
    from twinkle.server.config.from_groups import _model_id
    from twinkle.server.export import _env_float

    assert _model_id({}) == "ms://Qwen/Qwen3.5-4B"
    assert _model_id({"TWINKLE_BASE_MODEL": "tiny://qwen3.5"}) == "tiny://qwen3.5"
    monkeypatch.setenv("TWINKLE_EXPORT_TIMEOUT_S", "12.5")
    assert _env_float(server_env.TWINKLE_EXPORT_TIMEOUT_S) == 12.5
    monkeypatch.setenv("TWINKLE_EXPORT_TIMEOUT_S", "soon")  # an invalid number keeps the default
    assert _env_float(server_env.TWINKLE_EXPORT_TIMEOUT_S) == 3600.0


def test_client_direct_flag(monkeypatch):
    from twinkle_client import TwinkleClient

    def direct() -> bool:
        client = TwinkleClient(base_url="http://main.test", heartbeat_interval_s=None)
        try:
            return client._direct
        finally:
            client.close()

    monkeypatch.delenv("TWINKLE_CLIENT_DIRECT", raising=False)
    assert direct() is True
    monkeypatch.setenv("TWINKLE_CLIENT_DIRECT", "false")  # "false" meant on before
    assert direct() is False
    monkeypatch.setenv("TWINKLE_CLIENT_DIRECT", "nope")
    with pytest.raises(ValueError, match="TWINKLE_CLIENT_DIRECT='nope'"):
        direct()
