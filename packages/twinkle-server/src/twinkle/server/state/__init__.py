"""Server state: a key-value store (memory, file or Redis) and the records kept in it.

``create_store(config.persistence)`` builds the store; :class:`ServerState` is the domain layer the
gateway, model and sampler deployments share. See ``docs/server_state.md``.
"""

from twinkle.server.state.errors import (
    BadRequestError,
    ConflictError,
    ForbiddenError,
    GoneError,
    NotFoundError,
    StateError,
)
from twinkle.server.state.factory import PERSISTENCE_MODES, clear_persistence, create_store
from twinkle.server.state.file_store import FileStore
from twinkle.server.state.paths import (
    checkpoint_dir,
    parse_checkpoint_id,
    parse_checkpoint_path,
    tenant_id_for_key,
    validate_checkpoint_name,
)
from twinkle.server.state.records import (
    CheckpointRecord,
    FutureError,
    FutureRecord,
    SamplingSessionRecord,
    SessionRecord,
    TrainingRunRecord,
)
from twinkle.server.state.redis_store import RedisStore
from twinkle.server.state.server_state import ServerState
from twinkle.server.state.store import KVStore, MemoryStore

__all__ = [
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
