"""Hub tests build into a private cache so they never see (or leave) a user's ~/.cache/twinkle."""

import pytest


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    """A session-wide TWINKLE_CACHE_DIR: each tiny model is built once for all hub tests."""
    root = tmp_path_factory.mktemp("twinkle-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TWINKLE_CACHE_DIR", str(root))
        yield root
