"""A live server (gateway, model, processor; no sampler) shared by each client test module."""

from __future__ import annotations

import pytest
from serving import full_server


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """``(base_url, local_server)`` of a server on a loopback port."""
    with full_server(tmp_path_factory.mktemp("client"), sampler=False) as served:
        yield served
