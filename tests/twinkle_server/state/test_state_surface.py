"""The public surface of ``twinkle.server.state`` and ``twinkle.server.web.auth``."""

from __future__ import annotations

import inspect

import pytest

import twinkle.server.state as state
from twinkle.server.web import auth

pytestmark = pytest.mark.unit


def test_state_all_is_the_surface():
    assert sorted(state.__all__) == sorted(
        [
            "PERSISTENCE_MODES",
            "BadRequestError",
            "CheckpointRecord",
            "ConflictError",
            "FileStore",
            "ForbiddenError",
            "FutureError",
            "FutureRecord",
            "GoneError",
            "KVStore",
            "MemoryStore",
            "NotFoundError",
            "RedisStore",
            "SamplingSessionRecord",
            "ServerState",
            "SessionRecord",
            "StateError",
            "TrainingRunRecord",
            "checkpoint_dir",
            "clear_persistence",
            "create_store",
            "parse_checkpoint_id",
            "parse_checkpoint_path",
            "tenant_id_for_key",
            "validate_checkpoint_name",
        ]
    )
    for name in state.__all__:
        assert getattr(state, name) is not None


def test_kvstore_interface():
    abstract = {"get", "put", "delete", "scan", "update", "clear"}
    assert state.KVStore.__abstractmethods__ == abstract
    assert list(inspect.signature(state.KVStore.update).parameters) == ["self", "key", "fn"]
    for impl in (state.MemoryStore, state.FileStore, state.RedisStore):
        assert issubclass(impl, state.KVStore) and not inspect.isabstract(impl)


def test_error_statuses():
    statuses = {
        state.BadRequestError: 400,
        state.ForbiddenError: 403,
        state.NotFoundError: 404,
        state.ConflictError: 409,
        state.GoneError: 410,
    }
    for error, status in statuses.items():
        assert issubclass(error, state.StateError) and error.status_code == status


def test_auth_signatures():
    params = inspect.signature(auth.ApiKeyAuth).parameters
    assert list(params)[:4] == ["keys", "keys_file", "env_var", "allow_anonymous"]
    assert params["env_var"].default == "TWINKLE_SERVER_API_KEYS"
    assert auth.PUBLIC_PATHS == {"/healthz", "/api/v1/healthz", "/health"}
