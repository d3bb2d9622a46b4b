"""The history the server keeps with each run: bounded, thinned, in every store, owner-only;
recorded by the model service for native calls; exported by ``twinkle-server export-history``."""

import asyncio
import time

import numpy as np
import pytest
import yaml
from test_trackers import tensorboard_scalars

from twinkle.server.process import cli
from twinkle.server.state import (
    FileStore,
    MemoryStore,
    NotFoundError,
    RedisStore,
    ServerState,
    _history,
)
from twinkle.server.state.errors import BadRequestError
from twinkle.server.testing import client, config_dict, local_server
from twinkle_client.tracking import HistoryPoint

MODEL = "/api/v1/model/tiny/qwen3"


@pytest.fixture(params=["memory", "file", "redis"])
def state(request, tmp_path):
    if request.param == "memory":
        store = MemoryStore("h:")
    elif request.param == "file":
        store = FileStore(tmp_path / "state.json", "h:")
    else:
        store = RedisStore(request.getfixturevalue("redis_url"), f"h{time.monotonic_ns()}:")
    yield ServerState(store)
    store.close()


def new_run(state, owner="alice") -> str:
    session = state.create_session(owner)
    return state.create_run(owner, session.session_id, "tiny/qwen3", lora_rank=4).training_run_id


def points(first: int, last: int) -> list[HistoryPoint]:
    return [HistoryPoint(step=s, time=float(s), loss=1.0 / s) for s in range(first, last + 1)]


def test_each_store_keeps_the_history_bounded_newest_intact_oldest_thinned(state, monkeypatch):
    monkeypatch.setattr(_history, "BLOCK_POINTS", 10)
    monkeypatch.setattr(_history, "MAX_BLOCKS", 4)
    run = new_run(state)
    for first in range(1, 100, 7):  # batches that straddle blocks
        state.append_history("alice", run, points(first, min(first + 6, 100)))
    history = state.get_training_history("alice", run)
    steps = [p.step for p in history.points]
    assert len(steps) <= 40 and history.recorded == 100 and history.thinned
    assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-10:] == list(range(91, 101))
    assert history.points[-1].loss == pytest.approx(0.01)
    assert [p.step for p in state.get_training_history("alice", run, since_step=97).points] == [
        98,
        99,
        100,
    ]
    blocks = [k for k, _ in state.store.scan(_history.HISTORY_BLOCK)]
    assert len(blocks) == 3  # + the open one in the index; thinned ones deleted, not left behind


def test_another_owner_sees_no_history_and_cannot_write_it(state):
    run = new_run(state)
    state.append_history("alice", run, points(1, 3))
    with pytest.raises(NotFoundError):
        state.get_training_history("bob", run)
    with pytest.raises(NotFoundError):
        state.append_history("bob", run, points(4, 4))
    assert [p.step for p in state.get_training_history("alice", run).points] == [1, 2, 3]


def test_a_bad_since_step_is_a_400_naming_it(state):
    run = new_run(state)
    with pytest.raises(BadRequestError, match="since_step"):
        state.get_training_history("alice", run, since_step="3")


def rows(seed: int = 0) -> list[dict]:
    ids = np.random.default_rng(seed).integers(10, 4000, size=(2, 12)).tolist()
    return [{"input_ids": r, "labels": r} for r in ids]


async def wait_for_points(http, run_id: str, count: int) -> dict:
    deadline = time.monotonic() + 20
    while True:
        reply = await http.get(f"/api/v1/training_runs/{run_id}/history")
        assert reply.status_code == 200, reply.text
        if len(reply.json()["points"]) >= count or time.monotonic() > deadline:
            return reply.json()
        await asyncio.sleep(0.05)


def test_the_model_service_records_each_step_and_only_its_owner_reads_it(tmp_path):
    server = local_server(tmp_path, backend="mock")

    async def scenario():
        async with client(server, "alice") as http, client(server, "bob") as bob:
            added = await http.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "a", "config": {"r": 4}, "gradient_accumulation_steps": 2},
            )
            run_id = added.json()["result"]["training_run_id"]
            await http.post(
                f"{MODEL}/set_optimizer",
                json={"adapter_name": "a", "optimizer": "Adam", "lr": 0.05},
            )
            losses = []
            for step in range(6):  # 3 optimizer steps of 2 micro-batches each
                fb = await http.post(
                    f"{MODEL}/forward_backward", json={"adapter_name": "a", "inputs": rows(step)}
                )
                losses.append(fb.json()["result"]["loss"])
                await http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "a"})
            history = await wait_for_points(http, run_id, 3)
            assert history["run_id"] == run_id and history["recorded"] == 3
            got = history["points"]
            assert [p["step"] for p in got] == [1, 2, 3]
            assert [p["micro_batches"] for p in got] == [2, 2, 2]
            assert [p["num_tokens"] for p in got] == [44, 44, 44]  # 2 rows x 11 targets, twice
            for i, point in enumerate(got):
                assert point["loss"] == pytest.approx(np.mean(losses[2 * i : 2 * i + 2]))
                assert point["learning_rate"] == pytest.approx(0.05)
                assert point["grad_norm"] > 0
            assert got[0]["step_time_s"] is None and got[1]["step_time_s"] >= 0
            tail = await http.get(f"/api/v1/training_runs/{run_id}/history?since_step=2")
            assert [p["step"] for p in tail.json()["points"]] == [3]
            bad = await http.get(f"/api/v1/training_runs/{run_id}/history?since_step=-1")
            assert bad.status_code == 400 and "since_step" in bad.text
            other = await bob.get(f"/api/v1/training_runs/{run_id}/history")
            assert other.status_code == 404

    asyncio.run(scenario())


def test_export_history_cli_writes_a_file_stores_history_to_tensorboard(tmp_path, capsys):
    state = ServerState(FileStore(tmp_path / "state.json"))  # the config's default: no prefix
    run = new_run(state)
    state.append_history("alice", run, points(1, 3))
    config = config_dict(backend="mock")
    config["persistence"] = {"mode": "file", "file_path": str(tmp_path / "state.json")}
    (tmp_path / "server.yaml").write_text(yaml.safe_dump(config))
    args = ["export-history", run, "--to", "tensorboard", str(tmp_path / "tb")]
    assert cli.main([*args, "-c", str(tmp_path / "server.yaml")]) == 0
    assert "exported 3 points" in capsys.readouterr().out
    loss = tensorboard_scalars(tmp_path / "tb")["loss"]
    assert loss == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    missing = ["export-history", "nope", "--to", "tensorboard", str(tmp_path / "tb2")]
    assert cli.main([*missing, "-c", str(tmp_path / "server.yaml")]) == 1
    assert "no training history of run 'nope'" in capsys.readouterr().err
