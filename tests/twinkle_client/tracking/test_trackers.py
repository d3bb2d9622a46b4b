"""Each tracker adapter writes through its own library; each test reads back what that library
wrote with that library's own reader (TensorBoard's EventAccumulator, ``wandb leet inspect``,
``MlflowClient.get_metric_history``)."""

import glob
import json
import shutil
import subprocess
import sys

import pytest

from twinkle_client.tracking import (
    HistoryPoint,
    MultiTracker,
    TrainingHistory,
    export_history,
    make_tracker,
    register_tracker,
    tracker_names,
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


def tensorboard_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_tensorboard_event_files_hold_each_scalar_at_its_step(tmp_path):
    assert export_history(HISTORY, make_tracker("tensorboard", path=tmp_path / "tb")) == 3
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert scalars["loss"] == [(1, 2.5), (2, 2.0), (5, 1.25)]
    assert scalars["grad_norm"] == [(1, 4.0), (5, 1.0)]
    assert scalars["metrics/kl"] == [(2, 0.5)]
    assert [s for s, _ in scalars["num_tokens"]] == [1, 2, 5]


def test_wandb_offline_run_holds_the_history(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    wandb_cli = shutil.which("wandb") or f"{sys.executable} -m wandb"
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    tracker = make_tracker("wandb", project="p", name="run-1", path=tmp_path / "wb", mode="offline")
    export_history(HISTORY, tracker)
    (log,) = glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    out = subprocess.run(
        [*wandb_cli.split(), "leet", "inspect", log, "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    rows = [json.loads(line)["history"] for line in out.splitlines() if '"history"' in line]
    got = [(r["step"]["num"], r["item"]["loss"], r["item"].get("metrics/kl")) for r in rows]
    assert got == [(1, 2.5, None), (2, 2.0, 0.5), (5, 1.25, None)]


def test_mlflow_file_store_holds_each_metric_history(tmp_path):
    from mlflow.tracking import MlflowClient

    tracker = make_tracker("mlflow", path=tmp_path / "mlruns", experiment="e", run_name="r")
    export_history(HISTORY, tracker)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    losses = client.get_metric_history(tracker.run_id, "loss")
    assert [(m.step, m.value) for m in losses] == [(1, 2.5), (2, 2.0), (5, 1.25)]
    lrs = client.get_metric_history(tracker.run_id, "learning_rate")
    assert [(m.step, m.value) for m in lrs] == [(1, 1e-3), (2, 1e-3), (5, 5e-4)]


class _Recording:
    def __init__(self, fail_close=False):
        self.logged, self.closed, self.fail_close = [], False, fail_close

    def log(self, step, metrics):
        self.logged.append((step, dict(metrics)))

    def close(self):
        self.closed = True
        if self.fail_close:
            raise RuntimeError("disk full")


def test_multi_tracker_fans_out_and_closes_every_tracker_even_after_a_failure():
    first, second = _Recording(fail_close=True), _Recording()
    both = MultiTracker([first, second])
    both.log(3, {"loss": 1.0})
    with pytest.raises(RuntimeError, match="disk full"):
        both.close()
    assert first.logged == second.logged == [(3, {"loss": 1.0})]
    assert first.closed and second.closed


def test_unknown_tracker_names_the_known_ones_and_registered_ones_are_made():
    with pytest.raises(
        ValueError, match=r"unknown tracker 'neptune'.*'mlflow', 'swanlab', 'tensorboard'"
    ):
        make_tracker("neptune")
    register_tracker("recording", _Recording)
    assert "recording" in tracker_names()
    assert isinstance(make_tracker("recording"), _Recording)


def test_a_bad_step_or_value_is_refused_before_anything_is_written(tmp_path):
    tracker = make_tracker("tensorboard", path=tmp_path)
    with pytest.raises(TypeError, match="step must be an int"):
        tracker.log(1.5, {"loss": 1.0})
    with pytest.raises(TypeError, match="metric 'loss' must be a number"):
        tracker.log(1, {"loss": "low"})
    tracker.close()
    assert tensorboard_scalars(tmp_path) == {}
