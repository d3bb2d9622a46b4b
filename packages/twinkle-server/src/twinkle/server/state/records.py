"""The records the server keeps: one pydantic model per concept of the Tinker API.

Records are tolerant (``extra="ignore"``) so that a newer server can add fields and an older one can
still read its store; every record carries the ``owner`` (tenant id) that may see it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CheckpointKind = Literal["weights", "sampler_weights", "external_weights"]
CheckpointType = Literal["training", "sampler", "external"]
RunStatus = Literal["active", "unloaded", "lost"]
FutureStatus = Literal["pending", "done", "error"]
QueueState = Literal["active", "paused_rate_limit", "paused_capacity"]
ErrorCategory = Literal["user", "server", "unknown"]

CHECKPOINT_TYPE_BY_KIND: dict[str, CheckpointType] = {
    "weights": "training",
    "sampler_weights": "sampler",
    "external_weights": "external",
}
KIND_BY_CHECKPOINT_TYPE: dict[str, CheckpointKind] = {
    t: k
    for k, t in CHECKPOINT_TYPE_BY_KIND.items()  # type: ignore[misc]
}


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SessionRecord(_Record):
    """A client session (one ``ServiceClient``), kept alive by heartbeats."""

    session_id: str
    owner: str
    created_at: float
    last_heartbeat: float
    tags: list[str] = Field(default_factory=list)
    user_metadata: dict[str, Any] = Field(default_factory=dict)
    sdk_version: str | None = None
    finished: bool = False


class TrainingRunRecord(_Record):
    """A trainable LoRA adapter over a base model (the Tinker ``model_id`` / training run)."""

    training_run_id: str
    owner: str
    session_id: str
    base_model: str
    model_seq_id: int = 0
    is_lora: bool = True
    lora_rank: int
    lora_config: dict[str, Any] = Field(default_factory=dict)
    created_at: float
    last_request_time: float
    corrupted: bool = False
    status: RunStatus = "active"
    last_checkpoint: dict[str, Any] | None = None
    last_sampler_checkpoint: dict[str, Any] | None = None
    user_metadata: dict[str, Any] = Field(default_factory=dict)
    # The tenant's adapter name on the model deployment (to tell a lost adapter from none).
    adapter_name: str | None = None


EPHEMERAL_PREFIX = "ephemeral-"
#: Why a tenant's checkpoint name may not start with :data:`EPHEMERAL_PREFIX`.
RESERVED_NAME = (
    f"names starting with '{EPHEMERAL_PREFIX}' are reserved for the server's unnamed sampler "
    "snapshots (deleted when their session ends); choose another name"
)


class CheckpointRecord(_Record):
    """A saved checkpoint: ``weights/<name>`` (training state) or ``sampler_weights/<name>``."""

    training_run_id: str
    owner: str
    checkpoint_id: str
    checkpoint_type: CheckpointType
    name: str
    time: float
    path: str
    local_dir: str
    size_bytes: int | None = None
    public: bool = False
    expires_at: float | None = None

    @property
    def kind(self) -> CheckpointKind:
        """``weights``, ``sampler_weights`` or ``external_weights``: the middle component of the
        checkpoint path."""
        return KIND_BY_CHECKPOINT_TYPE[self.checkpoint_type]

    @property
    def ephemeral(self) -> bool:
        """A sampler snapshot made for one sampling client (Tinker's unnamed
        ``save_weights_for_sampler``): kept until its TTL, but not a saved checkpoint to list."""
        return self.kind == "sampler_weights" and self.name.startswith(EPHEMERAL_PREFIX)

    @property
    def tinker_path(self) -> str:
        """The same checkpoint as a ``tinker://`` path (what the Tinker SDK expects)."""
        return "tinker://" + self.path.split("://", 1)[1]

    def is_expired(self, now: float) -> bool:
        """Whether the checkpoint's TTL has passed at ``now``."""
        return self.expires_at is not None and self.expires_at <= now

    def to_tinker(self) -> dict[str, Any]:
        """The Tinker ``Checkpoint`` wire object (times as ISO 8601 UTC)."""

        def iso(ts: float | None) -> str | None:
            return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat()

        return {
            "checkpoint_id": self.checkpoint_id,
            "checkpoint_type": self.checkpoint_type,
            "time": iso(self.time),
            "tinker_path": self.tinker_path,
            "size_bytes": self.size_bytes,
            "public": self.public,
            "expires_at": iso(self.expires_at),
        }


class FutureError(_Record):
    """Why a future failed; ``category`` follows the Tinker ``RequestFailedResponse``."""

    category: ErrorCategory = "unknown"
    message: str


class FutureRecord(_Record):
    """An asynchronous request; ``retrieve_future`` reads it until it is done or failed."""

    request_id: str
    owner: str
    model_id: str | None = None
    kind: str
    status: FutureStatus = "pending"
    result: Any = None
    result_b64: str | None = None
    content_type: str = "application/json"
    error: FutureError | None = None
    queue_state: QueueState = "active"
    created_at: float
    finished_at: float | None = None
    # The gateway process running it (its lease says whether that process still lives).
    instance: str | None = None


class SamplingSessionRecord(_Record):
    """A sampler bound to a base model, optionally with an adapter (``model_path``)."""

    sampling_session_id: str
    owner: str
    session_id: str
    base_model: str | None = None
    model_path: str | None = None
    adapter_dir: str | None = None
    created_at: float
