"""A server killed with SIGKILL and relaunched keeps sessions, runs and checkpoints (file / Redis)."""

import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import yaml

from twinkle.server.testing import free_port

KEY = "restart-key-1"
MODEL = "/api/v1/model/tiny/qwen3"


def _write_config(tmp_path, persistence):
    config = {
        "http_options": {"host": "127.0.0.1", "port": free_port()},
        "persistence": persistence,
        "storage": {"root": str(tmp_path / "storage")},
        "applications": [
            {
                "name": "server",
                "route_prefix": "/api/v1",
                "import_path": "server",
                "args": {"server_config": {"supported_models": ["tiny/qwen3"]}},
            },
            {
                "name": "model",
                "route_prefix": MODEL,
                "import_path": "model",
                "args": {"backend": "transformers", "model_id": "tiny://qwen3"},
            },
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, f"http://127.0.0.1:{config['http_options']['port']}"


def _start(config_path, url):
    env = {**os.environ, "TWINKLE_SERVER_API_KEYS": KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "twinkle.server", "launch", "-c", str(config_path), "--local"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/api/v1/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError("server did not start")


def _features():
    ids = np.random.default_rng(0).integers(10, 4000, size=(2, 12)).tolist()
    return [{"input_ids": r, "labels": r} for r in ids]


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["file", "redis"])
def test_sigkill_and_relaunch_keeps_every_record(tmp_path, mode, request):
    persistence = {"mode": "file", "file_path": str(tmp_path / "state.json")}
    if mode == "redis":
        persistence = {
            "mode": "redis",
            "redis_url": request.getfixturevalue("redis_url"),
            "key_prefix": f"restart-{os.getpid()}:",
        }
    config_path, url = _write_config(tmp_path, persistence)
    headers = {"Authorization": f"Bearer {KEY}"}
    proc = _start(config_path, url)
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            session = http.post("/api/v1/create_session", json={"tags": ["restart"]}).json()[
                "session_id"
            ]
            run = http.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "a", "config": {"r": 4}, "session_id": session},
            )
            run_id = run.json()["result"]["training_run_id"]
            http.post(
                f"{MODEL}/set_optimizer",
                json={"adapter_name": "a", "optimizer": "Adam", "lr": 1e-2},
            )
            for _ in range(2):
                assert (
                    http.post(
                        f"{MODEL}/forward_backward",
                        json={"adapter_name": "a", "inputs": _features()},
                    ).status_code
                    == 200
                )
                http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "a"})
            path = http.post(
                f"{MODEL}/save", json={"adapter_name": "a", "name": "ck", "save_optimizer": True}
            ).json()["result"]["path"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    proc = _start(config_path, url)
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            assert (
                http.post("/api/v1/session_heartbeat", json={"session_id": session}).status_code
                == 200
            )
            runs = http.get("/api/v1/training_runs").json()["training_runs"]
            assert [r["training_run_id"] for r in runs] == [run_id]
            checkpoints = http.get(f"/api/v1/training_runs/{run_id}/checkpoints").json()[
                "checkpoints"
            ]
            assert [c["twinkle_path"] for c in checkpoints] == [path]
            # The adapter itself lived in the killed process; its checkpoint loads into a new one.
            http.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "a2", "config": {"r": 4}, "session_id": session},
            )
            progress = http.post(
                f"{MODEL}/resume_from_checkpoint", json={"adapter_name": "a2", "path": path}
            )
            assert progress.status_code == 200, progress.text
            assert progress.json()["result"]["cur_step"] == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
