"""Hub tests build into a private cache so they never see (or leave) a user's ~/.cache/twinkle."""

import pytest


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    """A session-wide TWINKLE_CACHE_DIR: each tiny model is built once for all hub tests."""
    root = tmp_path_factory.mktemp("twinkle-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TWINKLE_CACHE_DIR", str(root))
        yield root


@pytest.fixture
def standin_hub(tmp_path, monkeypatch):
    """A loopback ModelScope hub (``modelscope_standin``) that accepts ``ms-alice`` (user alice),
    ``ms-bob`` (bob) and ``ms-server`` (twinkle-bot); modelscope's own config (saved login, session
    file) lives in a private MODELSCOPE_HOME, and no token comes from the environment."""
    from modelscope_standin import serve_standin

    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "modelscope-home"))
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    users = {"ms-alice": "alice", "ms-bob": "bob", "ms-server": "twinkle-bot"}
    with serve_standin(users) as hub:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
        yield hub
