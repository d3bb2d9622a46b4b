"""The seed's run steps, as a user runs them: a Ray head, ``twinkle-server launch -c <cookbook
config>``, then ``python cookbook/client/...`` scripts, each a subprocess.

The machine is offline and has no GPU, so the ModelScope cache is seeded with the tiny model under
the seed's names, and the Ray head declares logical GPUs (the backends compute on the CPU when no
CUDA device is visible). Ray workers inherit the raylet's environment, not the launcher's: the
cache variables go to ``ray start`` as well.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COOKBOOK = REPO / "cookbook" / "client"
# The `ray` command of this interpreter; `python -m ray.scripts.scripts` where no script was
# installed next to it (a venv that reuses the system's site-packages).
_RAY_SCRIPT = Path(sys.executable).with_name("ray")
RAY_COMMAND = (
    [str(_RAY_SCRIPT)] if _RAY_SCRIPT.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
)
TWINKLE_SERVER = str(Path(sys.executable).with_name("twinkle-server"))
KEY = "EMPTY_API_KEY"  # what the client scripts send by default
SEEDS = [
    ("ms://Qwen/Qwen3.5-4B", "tiny://qwen3.5"),
    ("ms://tiny/qwen3.5", "tiny://qwen3.5"),  # the tiny and mock configs' base model
    ("ms://swift/self-cognition", "builtin://self-cognition"),
]


def require_port_8000() -> None:
    """The cookbook configs listen on 8000; skip (not fail) when something else holds it."""
    with socket.socket() as sock:
        if sock.connect_ex(("127.0.0.1", 8000)) == 0:
            pytest.skip("port 8000 is in use: the unmodified cookbook configs listen on it")


def offline_env(root: Path) -> dict[str, str]:
    """Environment of every process: offline hubs, a seeded ModelScope cache under ``root``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TWINKLE_SERVER_URL")}
    env.update(
        MODELSCOPE_CACHE=str(root / "modelscope"),
        TWINKLE_CACHE_DIR=str(root / "twinkle"),
        HF_HUB_OFFLINE="1",
        MODELSCOPE_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="disabled",
        TINKER_TELEMETRY="0",
    )
    for repo, source in SEEDS:
        dataset = ["--dataset"] if source.startswith("builtin://") else []
        subprocess.run(
            [sys.executable, "-m", "twinkle.hub", "seed", repo, *dataset, "--from", source],
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return env


def _wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-4000:]
            raise AssertionError(f"no {text!r} in {log.name} (exit {process.poll()}):\n{tail}")
        time.sleep(0.5)


def _stop(process: subprocess.Popen, sig: int, timeout_s: float) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def ray_head(env: dict[str, str], num_gpus: int = 4, num_cpus: int = 4):
    """``ray start --head --block`` with logical GPUs; yields its address. Stopped by its pid
    (``ray stop`` would stop every Ray on the machine)."""
    temp = Path(tempfile.mkdtemp(prefix="twc", dir="/tmp"))  # Ray's socket paths are bounded
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = temp / "head.log"
    with open(log, "wb") as out:
        head = subprocess.Popen(
            [*RAY_COMMAND, "start", "--head", "--block", f"--num-gpus={num_gpus}",
             f"--num-cpus={num_cpus}", f"--port={port}", "--node-ip-address=127.0.0.1",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_for_line(log, "--block", head, timeout_s=120)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(head, signal.SIGTERM, timeout_s=60)


@contextlib.contextmanager
def launched(config: str, env: dict[str, str], address: str, log: Path, *args: str):
    """``twinkle-server launch -c <config> [args]`` until "Twinkle server ready at"; SIGINT after."""
    env = {**env, "RAY_ADDRESS": address, "TWINKLE_SERVER_API_KEYS": env.get(
        "TWINKLE_SERVER_API_KEYS", KEY)}  # fmt: skip
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [TWINKLE_SERVER, "launch", "-c", config, *args],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_for_line(log, "Twinkle server ready at", server, timeout_s=600)
        yield "http://127.0.0.1:8000"
    finally:
        _stop(server, signal.SIGINT, timeout_s=120)


def run_script(script: str, env: dict[str, str], cwd: Path, **extra: str):
    """``python cookbook/client/<script>``; returns the completed process (output merged)."""
    return subprocess.run(
        [sys.executable, str(COOKBOOK / script)],
        cwd=cwd,
        env={**env, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )


def succeeded(result: subprocess.CompletedProcess) -> str:
    """The output of a script that must have exited 0."""
    assert result.returncode == 0, f"{result.args}:\n{result.stdout[-4000:]}"
    return result.stdout
