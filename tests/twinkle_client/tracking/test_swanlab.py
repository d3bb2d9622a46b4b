"""The SwanLab adapter writes through ``swanlab`` itself; each test reads the run file back with
SwanLab's own reader (the ``DataStoreReader`` and ``Record`` messages ``swanlab sync`` uploads
from).

SwanLab requires protobuf older than 7, so it is not in the dev environment: these tests run in
the one ``tools/make_swanlab_venv.sh`` builds, and skip elsewhere.
"""

import glob
import sys
from pathlib import Path

import pytest
import yaml

from twinkle_client.tracking import (
    HistoryPoint,
    TrainingHistory,
    export_history,
    make_tracker,
)

HISTORY = TrainingHistory(
    run_id="run-1",
    points=[
        HistoryPoint(step=1, time=1.0, loss=2.5, num_tokens=64, learning_rate=1e-3, grad_norm=4.0),
        HistoryPoint(
            step=2, time=2.0, loss=2.0, num_tokens=64, learning_rate=1e-3, metrics={"kl": 0.5}
        ),
        HistoryPoint(step=5, time=3.0, loss=1.25, num_tokens=32, learning_rate=5e-4, grad_norm=1.0),
    ],
    recorded=3,
)

SKIP_REASON = (
    "swanlab is not installed: it requires protobuf < 7, which the dev environment's server "
    "dependencies refuse; run tools/make_swanlab_venv.sh"
)


@pytest.fixture
def swanlab(tmp_path, monkeypatch):
    """The library, with its user settings kept under ``tmp_path``."""
    module = pytest.importorskip("swanlab", reason=SKIP_REASON)
    monkeypatch.setenv("SWANLAB_ROOT", str(tmp_path / "swanlab-root"))
    return module


def read_run(log_dir: Path) -> dict:
    """The one run under ``log_dir``, as SwanLab's reader gives it back: its start, finish and
    scalars (``{key: [(step, value)]}``)."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = glob.glob(str(log_dir / "run-*" / "run-*.swanlab"))
    reader = DataStoreReader()
    reader.open(path)
    run: dict = {"scalars": {}, "dir": Path(path).parent}
    try:
        for data in reader:
            record = Record.FromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "scalar":
                scalar = record.scalar
                run["scalars"].setdefault(scalar.key, []).append((scalar.step, scalar.value.number))
            elif kind in ("start", "finish"):
                run[kind] = getattr(record, kind)
    finally:
        reader.close()
    return run


def test_an_offline_run_holds_each_scalar_at_its_step(swanlab, tmp_path):
    from swanlab.proto.swanlab.run.v1.run_pb2 import RunState

    tracker = make_tracker(
        "swanlab", project="p", name="run-1", path=tmp_path / "sw", config={"lr": 1e-3}
    )
    assert export_history(HISTORY, tracker) == 3
    run = read_run(tmp_path / "sw")
    assert (run["start"].project, run["start"].name) == ("p", "run-1")
    assert run["finish"].state == RunState.RUN_STATE_FINISHED
    assert run["scalars"]["loss"] == [(1, 2.5), (2, 2.0), (5, 1.25)]
    assert run["scalars"]["grad_norm"] == [(1, 4.0), (5, 1.0)]
    assert run["scalars"]["metrics/kl"] == [(2, 0.5)]
    assert run["scalars"]["learning_rate"] == [(1, 1e-3), (2, 1e-3), (5, 5e-4)]
    assert [s for s, _ in run["scalars"]["num_tokens"]] == [1, 2, 5]
    config = yaml.safe_load((run["dir"] / "files" / "config.yaml").read_text())
    assert config["lr"]["value"] == 1e-3


def test_experiment_name_names_the_run_and_a_bad_value_is_refused(swanlab, tmp_path):
    tracker = make_tracker("swanlab", experiment_name="sft", path=tmp_path)
    try:
        tracker.log(1, {"loss": 0.5})
        with pytest.raises(TypeError, match="metric 'loss' must be a number"):
            tracker.log(2, {"loss": "low"})
        with pytest.raises(TypeError, match="step must be an int"):
            tracker.log(2.5, {"loss": 1.0})
    finally:
        tracker.close()
    run = read_run(tmp_path)
    assert (run["start"].project, run["start"].name) == ("twinkle", "sft")
    assert run["scalars"] == {"loss": [(1, 0.5)]}


def test_export_history_cli_writes_a_stored_history_to_swanlab(swanlab, tmp_path, capsys):
    from twinkle.server.process import cli
    from twinkle.server.state import FileStore, ServerState
    from twinkle.server.testing import config_dict

    state = ServerState(FileStore(tmp_path / "state.json"))
    session = state.create_session("alice")
    run_id = state.create_run(
        "alice", session.session_id, "tiny/qwen3", lora_rank=4
    ).training_run_id
    state.append_history("alice", run_id, HISTORY.points)
    config = config_dict(backend="mock")
    config["persistence"] = {"mode": "file", "file_path": str(tmp_path / "state.json")}
    (tmp_path / "server.yaml").write_text(yaml.safe_dump(config))
    args = ["export-history", run_id, "--to", "swanlab", str(tmp_path / "sw")]
    assert cli.main([*args, "-c", str(tmp_path / "server.yaml")]) == 0
    assert "exported 3 points" in capsys.readouterr().out
    assert read_run(tmp_path / "sw")["scalars"]["loss"] == [(1, 2.5), (2, 2.0), (5, 1.25)]


def test_without_swanlab_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "swanlab", None)  # an import of it now fails
    with pytest.raises(ImportError, match=r"pip install 'twinkle-client\[swanlab\]'.*protobuf"):
        make_tracker("swanlab")
