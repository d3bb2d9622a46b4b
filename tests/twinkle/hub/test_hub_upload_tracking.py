"""A hub that cannot be reached is a clear error within seconds (modelscope alone retries for a
quarter of a minute), and background uploads are tracked per owner until they are old."""

from __future__ import annotations

import socket
import time
from concurrent.futures import Future

import pytest

from twinkle.hub.upload import (
    HubUnreachableError,
    HubUpload,
    UploadTracker,
    check_reachable,
    hub_username,
    upload_to_hub,
)


def _closed_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _checkpoint(root):
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (root / name).write_bytes(b"{}")
    return root


def test_an_unreachable_hub_fails_fast_with_its_address(tmp_path):
    endpoint = _closed_endpoint()
    started = time.monotonic()
    with pytest.raises(HubUnreachableError, match=f"cannot reach the ModelScope hub at {endpoint}"):
        check_reachable(endpoint)
    with pytest.raises(HubUnreachableError):
        hub_username("ms-token", endpoint)
    with pytest.raises(HubUnreachableError):
        upload_to_hub(_checkpoint(tmp_path), "alice/x", token="ms-token", endpoint=endpoint)
    assert time.monotonic() - started < 10


def test_an_unreachable_hub_fails_a_background_upload(tmp_path):
    future = upload_to_hub(
        _checkpoint(tmp_path),
        "alice/x",
        token="ms-token",
        endpoint=_closed_endpoint(),
        async_upload=True,
    )
    with pytest.raises(HubUnreachableError):
        future.result(timeout=30)


def test_uploads_are_seen_by_their_owner_only_until_they_are_old():
    now = [1000.0]
    tracker = UploadTracker(keep_s=60, clock=lambda: now[0])
    running: Future = Future()
    started = tracker.start("alice", "alice/repo", running, token="caller")
    upload_id = started["upload_id"]
    assert started == {
        "upload_id": upload_id,
        "hub_model_id": "alice/repo",
        "token": "caller",
        "status": "started",
    }
    assert tracker.status("bob", upload_id) is None
    running.set_result(HubUpload("alice/repo", ("adapter_config.json",), "http://hub/alice/repo"))
    done = tracker.status("alice", upload_id)
    assert done["status"] == "uploaded" and done["files"] == ["adapter_config.json"]
    failed: Future = Future()
    failed_id = tracker.start("alice", "alice/other", failed)["upload_id"]
    failed.set_exception(ConnectionResetError("reset by peer\nsecond line"))
    assert tracker.status("alice", failed_id)["error"] == "ConnectionResetError: reset by peer"
    now[0] += 61
    assert tracker.status("alice", upload_id) is None and tracker.status("alice", failed_id) is None
