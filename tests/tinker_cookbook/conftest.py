"""Fixtures of the tinker-cookbook conformance tests (helpers in ``recipe_server``)."""

from __future__ import annotations

import pytest
from recipe_server import CookbookServer, launched_cookbook_server


@pytest.fixture(scope="session")
def cookbook_server(tmp_path_factory) -> CookbookServer:
    """The tiny server serving ``Qwen/Qwen3.5-4B``; skips without the cookbook's venv."""
    with launched_cookbook_server(tmp_path_factory.mktemp("cookbook")) as server:
        yield server
