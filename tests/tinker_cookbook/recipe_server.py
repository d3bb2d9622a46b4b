"""The tiny Twinkle server and the cookbook's interpreter, for the tinker-cookbook recipes.

The server serves the tiny model's weights under a registry name (``Qwen/Qwen3.5-4B``), because
the recipes choose their renderer and tokenizer from the model name. Both hub caches are seeded
under that name in a temporary directory that the server and every recipe process use:
the server resolves ``ms://Qwen/Qwen3.5-4B`` in the ModelScope cache, the recipes call
``AutoTokenizer.from_pretrained("Qwen/Qwen3.5-4B")``, which reads the Hugging Face cache.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO / "cookbook" / "client" / "server" / "tiny" / "server_config.yaml"
TWINKLE_SERVER = str(Path(sys.executable).with_name("twinkle-server"))
PYTHON_ENV = "TWINKLE_COOKBOOK_PYTHON"
DEFAULT_VENV_PYTHON = REPO / ".venv-cookbook" / "bin" / "python"
MODEL_NAME = "Qwen/Qwen3.5-4B"
API_KEY = "tml-twinkle-cookbook-conformance"
# guess_number's multi-turn episodes reach ~1,000 tokens; the tiny config's 512 is too short.
MAX_LENGTH = 4096


@dataclass(frozen=True)
class CookbookServer:
    base_url: str
    env: dict[str, str]  # what every recipe process runs with
    log: Path
    pid: int = 0  # the server's process (``--local``: every application's replica in it)


def cookbook_python() -> str:
    """The cookbook venv's interpreter: ``$TWINKLE_COOKBOOK_PYTHON``, else ``.venv-cookbook``."""
    configured = os.environ.get(PYTHON_ENV)
    if configured:
        return configured
    if DEFAULT_VENV_PYTHON.exists():
        return str(DEFAULT_VENV_PYTHON)
    pytest.skip(f"no tinker-cookbook venv: run tools/make_cookbook_venv.sh and set {PYTHON_ENV}")


def write_server_config(path: Path, port: int, execution: dict | None = None) -> None:
    """The tiny config, its model and sampler served as ``MODEL_NAME`` with ``MAX_LENGTH``;
    ``execution``: the model's ``execution:`` block."""
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["http_options"]["port"] = port
    server_app, model_app, sampler_app = config["applications"][:3]
    server_args = server_app["args"]["server_config"]
    server_args["supported_models"] = [MODEL_NAME]
    # A recipe that exits without closing its ServiceClient holds its adapter until the heartbeat
    # times out; five recipes in a row would hit the tiny config's limit of 3.
    server_args["per_token_model_limit"] = 32
    short = MODEL_NAME.split("/")[-1]
    for app, kind in ((model_app, "model"), (sampler_app, "sampler")):
        app["name"] = f"{'models' if kind == 'model' else kind}-{short}"
        app["route_prefix"] = f"/api/v1/{kind}/{MODEL_NAME}"
        app["args"]["model_id"] = f"ms://{MODEL_NAME}"
        app["args"]["max_length"] = MAX_LENGTH
    model_app["args"]["max_loras"] = 16
    if execution:
        model_app["args"]["execution"] = {**model_app["args"].get("execution", {}), **execution}
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(base_url: str, server: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{base_url}/api/v1/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-4000:]
    raise AssertionError(f"server not healthy (exit {server.poll()}):\n{tail}")


@contextlib.contextmanager
def launched_cookbook_server(root: Path, execution: dict | None = None):
    """``twinkle-server launch --local`` on the tiny model, seeded caches, a ``tml-`` key;
    ``execution``: the model's ``execution:`` block."""
    python = cookbook_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "TWINKLE_SERVER"))}
    env.update(
        MODELSCOPE_CACHE=str(root / "modelscope"),
        HF_HUB_CACHE=str(root / "huggingface"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        MODELSCOPE_OFFLINE="1",
        TINKER_TELEMETRY="0",
        WANDB_MODE="disabled",
    )
    for repo in (f"hf://{MODEL_NAME}", f"ms://{MODEL_NAME}"):
        subprocess.run(
            [sys.executable, "-m", "twinkle.hub", "seed", repo, "--from", "tiny://qwen3.5"],
            env=env, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    port = _free_port()
    config = root / "server_config.yaml"
    write_server_config(config, port, execution)
    log = root / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [TWINKLE_SERVER, "launch", "--local", "-c", str(config)],
            cwd=REPO, env={**env, "TWINKLE_SERVER_API_KEYS": API_KEY},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base_url, server, log, timeout_s=300)
        recipe_env = {
            **env,
            "TINKER_BASE_URL": base_url,
            "TINKER_API_KEY": API_KEY,
            "TWINKLE_COOKBOOK_PYTHON": python,
        }
        yield CookbookServer(base_url=base_url, env=recipe_env, log=log, pid=server.pid)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
