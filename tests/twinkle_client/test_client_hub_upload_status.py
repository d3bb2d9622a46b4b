"""``upload_to_hub`` as ModelScope Twinkle's scripts call it (``hub_token``, ``async_upload``,
``poll_interval``): the server uploads in the background and the client polls its status; a hub
that cannot be reached is a clear 400 within seconds, a failed upload a clear error."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
from serving import KEYS, MODEL_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle" / "hub"))

from modelscope_standin import serve_standin  # noqa: E402

from twinkle_client import TwinkleClient  # noqa: E402
from twinkle_client.errors import BadRequestError, NotFoundError  # noqa: E402
from twinkle_client.model import MultiLoraTransformersModel  # noqa: E402
from twinkle_client.model._hub_upload import HubUploadFailedError, RemoteUpload  # noqa: E402

FEATURES = [{"input_ids": list(range(10, 22)), "labels": [-100] * 3 + list(range(13, 22))}]
ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors"}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """Only ``ms-token`` is a ModelScope token (user alice); no API key of the server is one."""
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "modelscope-home"))
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    with serve_standin({"ms-token": "alice"}) as standin:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", standin.url)
        yield standin


@pytest.fixture(scope="module")
def saved(live):
    """Alice's model and one checkpoint of it: (model, twinkle path, its directory)."""
    client = TwinkleClient(base_url=live[0], api_key=KEYS["alice"], timeout=120)
    model = MultiLoraTransformersModel(model_id=MODEL_ID, client=client)
    model.add_adapter_to_model("default", {"r": 4, "lora_alpha": 8})
    model.forward_backward(inputs=FEATURES)
    path = model.save("to-hub")
    owner = live[1].context.authenticate({"x-api-key": KEYS["alice"]})
    directory = Path(live[1].context.state.resolve_checkpoint_path(owner, path).local_dir)
    yield model, path, directory
    model.remove_adapter()
    client.close()


def _files(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in ADAPTER_FILES}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_hub_token_uploads_in_the_background_and_the_call_waits(hub, saved):
    model, path, directory = saved
    reply = model.upload_to_hub(
        checkpoint_dir=path, hub_model_id="alice/sync", hub_token="ms-token", poll_interval=0.05
    )
    assert reply["status"] == "uploaded" and reply["token"] == "request"
    assert set(reply["files"]) == ADAPTER_FILES and reply["url"].endswith("/models/alice/sync")
    assert hub.files["alice/sync"] == _files(directory)
    assert hub.tokens_used() == {"ms-token"}


def test_async_upload_returns_a_status_to_poll(hub, saved, live):
    model, path, directory = saved
    upload = model.upload_to_hub(path, "alice/async", hub_token="ms-token", async_upload=True)
    assert isinstance(upload, RemoteUpload) and upload["status"] in ("started", "uploaded")
    assert upload.result(timeout=60, poll_interval=0.05)["status"] == "uploaded"
    assert upload.done() and hub.files["alice/async"] == _files(directory)
    with TwinkleClient(base_url=live[0], api_key=KEYS["bob"]) as bob:
        theirs = MultiLoraTransformersModel(model_id=MODEL_ID, client=bob)
        with pytest.raises(NotFoundError, match="no upload"):
            theirs._upload_status(upload.upload_id)


def test_a_token_the_hub_refuses_fails_the_upload_with_its_reason(hub, saved):
    model, path, _ = saved
    with pytest.raises(HubUploadFailedError, match="refused"):
        model.upload_to_hub(path, "alice/refused", hub_token="not-a-token", poll_interval=0.05)
    assert hub.files == {}


@pytest.mark.parametrize("hub_token", ["ms-token", None])
def test_an_unreachable_hub_is_a_clear_error_within_seconds(saved, monkeypatch, hub_token):
    model, path, _ = saved
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", endpoint)
    started = time.monotonic()
    with pytest.raises(BadRequestError, match=f"cannot reach the ModelScope hub at {endpoint}"):
        model.upload_to_hub(path, "alice/nowhere", hub_token=hub_token)
    assert time.monotonic() - started < 10
