"""The contract suite's two backends: local ``twinkle`` and ``twinkle_client`` on a live server.

Each test takes ``ns``, a :class:`Backend`, and uses ``ns.model``, ``ns.sampler``, ``ns.dataset``
and ``ns.dataloader`` exactly as a training script would use ``twinkle.X`` or ``twinkle_client.X``.
The remote server is one in-process server (gateway, model, sampler, processor) under uvicorn on
a loopback port, shared by the whole module.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "twinkle_client"))

from serving import KEYS, MODEL_ID, full_server  # noqa: E402


@dataclass
class Backend:
    """One implementation of the mirrored API, plus how to act as another tenant."""

    name: str
    clients: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for module in ("model", "sampler", "dataset", "dataloader", "data_format"):
            setattr(self, module, importlib.import_module(f"{self.name}.{module}"))

    @property
    def remote(self) -> bool:
        return self.name == "twinkle_client"

    def model_for(self, tenant: str):
        """The model a tenant trains on: one shared object locally, one per API key remotely."""
        if self.remote:
            model = self.model.MultiLoraTransformersModel(
                model_id=MODEL_ID, client=self.clients[tenant]
            )
            self.shared.setdefault("remote_models", []).append(model)
            return model
        if "model" not in self.shared:
            self.shared["model"] = self.model.MultiLoraTransformersModel(model_id=MODEL_ID)
        return self.shared["model"]


@pytest.fixture(scope="module")
def live_url(tmp_path_factory):
    with full_server(tmp_path_factory.mktemp("contract")) as (url, _):
        yield url


@pytest.fixture(params=["twinkle", "twinkle_client"])
def ns(request, tmp_path, monkeypatch):
    monkeypatch.setenv("TWINKLE_OUTPUT_DIR", str(tmp_path / "output"))
    if request.param == "twinkle":
        yield Backend("twinkle")
        return
    from twinkle_client import TwinkleClient, init_twinkle_client

    url = request.getfixturevalue("live_url")
    clients = {"alice": init_twinkle_client(base_url=url, api_key=KEYS["alice"], timeout=120)}
    clients["bob"] = TwinkleClient(base_url=url, api_key=KEYS["bob"], timeout=120)
    backend = Backend("twinkle_client", clients=clients)
    yield backend
    # The server is shared by the module and holds few adapters: free what the test made.
    for model in backend.shared.get("remote_models", []):
        for name in model.list_adapters():
            model.remove_adapter(name)
    for client in clients.values():
        client.close()


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/contract/" in str(item.fspath):
            item.add_marker(pytest.mark.contract)
