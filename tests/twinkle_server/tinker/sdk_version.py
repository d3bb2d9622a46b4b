"""Running the SDK suite under an older official ``tinker`` (tools/run_tinker_sdk_versions.sh).

The server pins ``tinker==0.38.0`` (it reads the SDK's wire types and protobuf module), so under an
older SDK it cannot share the test process: with ``TWINKLE_TINKER_SERVER_PYTHON`` set (a Python
with the pinned SDK), :func:`serve_in_subprocess` starts it there, and the tests see it over HTTP
only. Tests that look inside the server object skip then (:data:`needs_in_process_server`), tests
of calls an older SDK lacks skip with :func:`requires_sdk`.

Run as a script, this module is that server process:
``python tests/twinkle_server/tinker/sdk_version.py STORAGE_DIR PORT``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER_PYTHON_ENV = "TWINKLE_TINKER_SERVER_PYTHON"
_HERE = Path(__file__).resolve().parent


def sdk_version() -> tuple[int, ...]:
    """The installed ``tinker`` SDK's version as a tuple, e.g. ``(0, 27, 0)``."""
    import tinker

    return tuple(int(part) for part in tinker.__version__.split(".")[:3] if part.isdigit())


def requires_sdk(minimum: str, what: str = "this call"):
    """Skip a test on SDKs older than ``minimum`` (e.g. ``"0.33"``), naming both versions."""
    import tinker

    wanted = tuple(int(part) for part in minimum.split("."))
    return pytest.mark.skipif(
        sdk_version() < wanted,
        reason=f"{what} needs tinker>={minimum}; installed tinker {tinker.__version__}",
    )


def adapt_creation_calls() -> None:
    """Let the tests' ``create_*_client(...).result()`` run on SDKs before 0.38.

    Those SDKs return the new client itself, where 0.38 returns a future that is also the client;
    a ``result()`` answering the client keeps one spelling of the tests for every version. Only the
    Python calling convention differs: the requests on the wire are the old SDK's own.
    """
    if sdk_version() >= (0, 38):
        return
    from tinker.lib.public_interfaces import sampling_client, training_client

    for cls in (training_client.TrainingClient, sampling_client.SamplingClient):
        if not hasattr(cls, "result"):
            cls.result = lambda self, timeout=None: self


needs_in_process_server = pytest.mark.skipif(
    bool(os.environ.get(SERVER_PYTHON_ENV)),
    reason=f"looks inside the server object; the server runs in another process ({SERVER_PYTHON_ENV})",
)


def in_process() -> bool:
    return not os.environ.get(SERVER_PYTHON_ENV)


@contextlib.contextmanager
def serve_in_subprocess(storage: Path, timeout_s: float = 300.0):
    """The tests' server config served by ``$TWINKLE_TINKER_SERVER_PYTHON``; yields the base URL."""
    import httpx

    from twinkle.server.testing import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(storage / "server.log", "wb")  # noqa: SIM115 - closed below, after the process
    proc = subprocess.Popen(
        [os.environ[SERVER_PYTHON_ENV], str(Path(__file__)), str(storage), str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(url + "/api/v1/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server at {url} not healthy within {timeout_s} s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _serve(storage: str, port: int) -> None:
    import uvicorn

    sys.path[:0] = [str(_HERE), str(_HERE.parent)]
    from conftest import tinker_config

    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    server = build_local_server(
        parse_config(tinker_config(Path(storage))), store=MemoryStore("tk:")
    )
    uvicorn.run(server.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
