"""A Tinker publish to a hub that cannot be reached, or that fails, is a clear 400 within seconds:
the SDK does not retry it (a 5xx it would retry for minutes)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import tinker

import twinkle.hub.upload as hub_upload
from twinkle.server import hub as server_hub
from twinkle.server.hub import HubPublisher
from twinkle.server.testing import KEYS, config_dict, serve_in_thread
from twinkle.server.web.errors import BadRequest

pytestmark = pytest.mark.integration

BASE_MODEL = "tiny/qwen3.5"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """(service, tinker path, request log) of a server whose hub is a closed loopback port."""
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore
    from twinkle_client import init_tinker_client

    config = config_dict(
        model_id="tiny://qwen3.5",
        server_args={"server_config": {"supported_models": [BASE_MODEL]}},
    )
    config["storage"] = {"root": str(tmp_path_factory.mktemp("unreachable") / "storage")}
    config["hub"] = {"endpoint": f"http://127.0.0.1:{_closed_port()}", "namespace": "org"}
    server = build_local_server(parse_config(config), store=MemoryStore("unreach:"))
    publishes: list[str] = []

    async def counting(scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/publish"):
            publishes.append(scope["method"])
        await server.app(scope, receive, send)

    with serve_in_thread(counting) as url:
        init_tinker_client()
        service = tinker.ServiceClient(base_url=url, api_key=KEYS["alice"])
        training = service.create_lora_training_client(base_model=BASE_MODEL, rank=4)
        path = training.result(timeout=60).save_state("to-publish").result(timeout=60).path
        yield service, path, publishes
        service.close("success").result(timeout=30)


def test_an_unreachable_hub_is_a_400_within_seconds_and_not_retried(published, monkeypatch):
    service, path, publishes = published
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-server")
    publishes.clear()
    started = time.monotonic()
    with pytest.raises(
        tinker.BadRequestError, match="cannot reach the ModelScope hub at http://127"
    ):
        service.create_rest_client().publish_checkpoint_from_tinker_path(path).result(timeout=60)
    assert time.monotonic() - started < 15
    assert publishes == ["POST"]  # one request: the SDK did not retry


def test_a_hub_that_does_not_answer_is_refused_at_the_deadline(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(hub_upload, "check_reachable", lambda *a, **k: release.wait(30))
    monkeypatch.setattr(server_hub, "REACH_DEADLINE_S", 0.5)
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-server")
    started = time.monotonic()
    try:
        with pytest.raises(BadRequest, match=r"no answer within 0.5 s"):
            HubPublisher(endpoint="http://hub.invalid").token_for("some-key")
    finally:
        release.set()
    assert time.monotonic() - started < 5


def test_a_failing_hub_is_a_400_naming_the_hub(monkeypatch, tmp_path):
    from modelscope_hub.errors import ServerError

    def fail(*args, **kwargs):
        raise ServerError("502 Bad Gateway")

    monkeypatch.setattr(hub_upload, "hub_username", fail)
    publisher = HubPublisher(endpoint="http://127.0.0.1:9", namespace=None)
    monkeypatch.setattr(HubPublisher, "check_reachable", lambda self, deadline_s=None: None)
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-server")
    with pytest.raises(
        BadRequest,
        match=r"hub at http://127.0.0.1:9 failed the publish \(ServerError: .*502 Bad Gateway",
    ):
        publisher.token_for("some-key")
