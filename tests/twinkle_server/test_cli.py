"""``twinkle-server``: subcommands, exit codes (0 ok, 1 invalid config, 2 usage) and messages."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from twinkle.server.config import parse_config
from twinkle.server.process import cli
from twinkle.server.process.launch import LaunchError

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "cookbook" / "client" / "server" / "tiny" / "server_config.yaml"


@pytest.fixture(autouse=True)
def _no_config_env(monkeypatch):
    monkeypatch.delenv("TWINKLE_SERVER_CONFIG", raising=False)
    monkeypatch.delenv("TWINKLE_RAY_NAMESPACE", raising=False)
    # The cookbook configs take their keys from the environment, as run.sh sets them.
    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", "EMPTY_API_KEY")


@pytest.fixture
def bad_config(tmp_path) -> Path:
    data = yaml.safe_load(TINY.read_text())
    data["applications"][1]["args"]["queue_config"] = {"rps_limt": 5}
    data["http_options"]["port"] = "abc"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.unit
def test_check_config_ok(capsys):
    assert cli.main(["check-config", "-c", str(TINY)]) == 0
    assert capsys.readouterr().out.startswith("OK: 4 applications")


@pytest.mark.unit
def test_check_config_invalid_names_every_field(bad_config, capsys):
    assert cli.main(["check-config", "--config", str(bad_config)]) == 1
    err = capsys.readouterr().err
    assert str(bad_config) in err
    assert "applications[1].args.queue_config.rps_limt: unknown field" in err
    assert "http_options.port:" in err


@pytest.mark.unit
def test_config_comes_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("TWINKLE_SERVER_CONFIG", str(TINY))
    assert cli.main(["check-config"]) == 0
    assert "OK: 4 applications" in capsys.readouterr().out


@pytest.mark.unit
def test_missing_config_is_a_usage_error(capsys):
    assert cli.main(["check-config"]) == 2
    assert "TWINKLE_SERVER_CONFIG" in capsys.readouterr().err


@pytest.mark.unit
def test_absent_file_is_an_invalid_config(tmp_path, capsys):
    assert cli.main(["check-config", "-c", str(tmp_path / "nope.yaml")]) == 1
    assert "nope.yaml" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize(
    "argv", [[], ["frobnicate"], ["print-config", "--format", "toml"], ["check-config", "-x"]]
)
def test_usage_errors_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_print_config_round_trips(fmt, capsys):
    assert cli.main(["print-config", "-c", str(TINY), "--format", fmt]) == 0
    out = capsys.readouterr().out
    data = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert parse_config(data) == parse_config(yaml.safe_load(TINY.read_text()))


@pytest.mark.unit
def test_launch_passes_the_namespace(monkeypatch):
    seen = {}

    def fake_launch(config, namespace=None, blocking=True, address=None, replace=False):
        seen.update(apps=len(config.applications), namespace=namespace, blocking=blocking)
        seen.update(address=address, replace=replace)
        return "http://127.0.0.1:8000/api/v1"

    monkeypatch.setattr("twinkle.server.process.launch.launch", fake_launch)
    monkeypatch.setenv("TWINKLE_RAY_NAMESPACE", "from-env")
    assert cli.main(["launch", "-c", str(TINY)]) == 0
    assert seen == {
        "apps": 4, "namespace": "from-env", "blocking": True, "address": None, "replace": False
    }  # fmt: skip
    assert cli.main(["launch", "-c", str(TINY), "--namespace", "explicit"]) == 0
    assert seen["namespace"] == "explicit"
    assert cli.main(["launch", "-c", str(TINY), "--address", "local", "--replace"]) == 0
    assert (seen["address"], seen["replace"]) == ("local", True)


@pytest.mark.unit
def test_launch_failure_exits_1(monkeypatch, capsys):
    def failing_launch(config, namespace=None, blocking=True, address=None, replace=False):
        raise LaunchError("application 'server' is DEPLOY_FAILED: boom")

    monkeypatch.setattr("twinkle.server.process.launch.launch", failing_launch)
    assert cli.main(["launch", "-c", str(TINY)]) == 1
    assert "application 'server' is DEPLOY_FAILED" in capsys.readouterr().err


@pytest.mark.unit
def test_clear_memory_persistence_has_nothing_to_clear(capsys):
    assert cli.main(["clear", "persistence", "-c", str(TINY)]) == 0
    assert "nothing to clear" in capsys.readouterr().out


@pytest.mark.unit
def test_clear_file_persistence_calls_the_state_module(monkeypatch, capsys):
    cleared = []
    fake_state = types.ModuleType("twinkle.server.state")
    fake_state.clear_persistence = lambda persistence: cleared.append(persistence) or 7
    monkeypatch.setitem(sys.modules, "twinkle.server.state", fake_state)
    path = TINY.with_name("server_config_file.yaml")
    assert cli.main(["clear", "persistence", "-c", str(path)]) == 0
    assert [p.mode for p in cleared] == ["file"]
    assert "7 keys removed" in capsys.readouterr().out


@pytest.mark.unit
def test_status_delegates_its_arguments(monkeypatch):
    received = []
    fake_status = types.ModuleType("twinkle.server.process.status")
    fake_status.main = lambda argv: received.append(argv) or 0
    monkeypatch.setitem(sys.modules, "twinkle.server.process.status", fake_status)
    assert cli.main(["status", "--url", "http://x", "--json"]) == 0
    assert received == [["--url", "http://x", "--json"]]


@pytest.mark.unit
def test_status_without_its_module_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "twinkle.server.process.status", None)
    assert cli.main(["status"]) == 2
    assert "twinkle.server.process.status" in capsys.readouterr().err


@pytest.mark.unit
def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("twinkle-server ")


@pytest.mark.integration
def test_module_entry_point_reports_invalid_config(bad_config):
    result = subprocess.run(
        [sys.executable, "-m", "twinkle.server", "check-config", "-c", str(bad_config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "applications[1].args.queue_config.rps_limt: unknown field" in result.stderr


@pytest.mark.unit
def test_local_launch_on_a_port_another_process_holds_fails_saying_so(tmp_path, capsys):
    import socket

    import yaml

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        data = yaml.safe_load(TINY.read_text())
        data["http_options"] = {**data.get("http_options", {}), "port": port}
        path = tmp_path / "busy.yaml"
        path.write_text(yaml.safe_dump(data))
        assert cli.main(["launch", "-c", str(path), "--local"]) == 1
    out = capsys.readouterr()
    assert f"cannot serve on 127.0.0.1:{port}" in out.err
    assert "local mode) on http" not in out.out  # no address announced that is not served
