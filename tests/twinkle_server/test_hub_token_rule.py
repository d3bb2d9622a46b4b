"""The hub token rule (hub.caller_key) for upload_to_hub and Tinker publish, against the stand-in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle" / "hub"))

from modelscope_standin import serve_standin  # noqa: E402

from twinkle.server.hub import HubPublisher  # noqa: E402
from twinkle.server.web.errors import BadRequest  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.fixture
def standin(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "home"))
    with serve_standin({"ms-alice": "alice", "ms-server": "twinkle-bot"}) as hub:
        yield hub


@pytest.mark.parametrize(
    "rule, server_token, presented, source",
    [
        ("first", "ms-server", "ms-alice", "caller"),
        ("first", "ms-server", "tml-ms-alice", "caller"),  # the Tinker SDK's prefix is dropped
        ("first", "ms-server", "not-a-hub-token", "server"),
        ("first", None, "ms-alice", "caller"),
        ("if_no_server_token", "ms-server", "ms-alice", "server"),
        ("if_no_server_token", None, "ms-alice", "caller"),
        ("never", "ms-server", "ms-alice", "server"),
    ],
)
def test_which_token_publishes(standin, monkeypatch, rule, server_token, presented, source):
    if server_token:
        monkeypatch.setenv("MODELSCOPE_API_TOKEN", server_token)
    else:
        monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    token = HubPublisher(endpoint=standin.url, caller_key=rule).token_for(presented)
    assert token.source == source
    assert token.token == ("ms-alice" if source == "caller" else server_token)
    assert "ms-" not in repr(token)  # the token never shows in logs


@pytest.mark.parametrize("rule", ["first", "if_no_server_token", "never"])
def test_no_usable_token_is_a_clear_400(standin, monkeypatch, rule):
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    with pytest.raises(BadRequest, match="MODELSCOPE_API_TOKEN"):
        HubPublisher(endpoint=standin.url, caller_key=rule).token_for("not-a-hub-token")
