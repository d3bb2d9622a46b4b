"""One identity for a tenant's adapter: the model holds it under the server's private internal
id, and every message about it shows the tenant's own name, down to the library's errors."""

from __future__ import annotations

import asyncio

import pytest

from twinkle.errors import InvalidArgumentError, StateOrderError
from twinkle.model import MockModel
from twinkle.server.model.registry import StateRunRegistry
from twinkle.server.model.service import ModelService
from twinkle.server.state import MemoryStore, ServerState
from twinkle.server.web.errors import BadRequest


def _service(model, tmp_path) -> ModelService:
    registry = StateRunRegistry(ServerState(MemoryStore("identity:")), tmp_path)
    return ModelService(model, "tiny/qwen3", registry)


def test_a_library_error_for_alice_names_alice_not_the_internal_id(tmp_path):
    service = _service(MockModel("tiny/qwen3", vocab_size=64), tmp_path)
    internal = service._internal("owner-1", "alice")

    async def scenario():
        await service.call("owner-1", "add_adapter_to_model", {"adapter_name": "alice"})
        await service.call("owner-1", "clip_grad_and_step", {"adapter_name": "alice"})

    with pytest.raises(BadRequest) as info:
        asyncio.run(scenario())
    # The library's own error (the cause of the server's answer) already names the tenant.
    library_error = info.value.__cause__
    assert isinstance(library_error, InvalidArgumentError)
    assert str(library_error) == "adapter 'alice' has no optimizer; call set_optimizer first"
    assert internal not in str(library_error)
    assert str(info.value) == str(library_error)
    # The model still holds the adapter under the internal id only.
    assert service.model.list_adapters() == [internal]


def test_the_transformers_backend_shows_the_display_name_and_keys_by_the_internal_one():
    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel("tiny://qwen3")
    model.add_adapter_to_model("a0123456789abcdef", {"r": 2}, display_name="alice")
    assert model.list_adapters() == ["a0123456789abcdef"]
    assert model.tenant("a0123456789abcdef").label == "alice"
    with pytest.raises(StateOrderError, match=r"^adapter 'alice' has no gradients"):
        model.clip_grad_and_step(adapter_name="a0123456789abcdef")
    # Without a display name the key is the name (a local script's own adapter name).
    model.add_adapter_to_model("bob", {"r": 2})
    assert model.tenant("bob").label == "bob"
