"""Responses of the management API: server capabilities, training runs and checkpoints.

Responses are tolerant (unknown fields are kept, missing optional ones default), so a newer
server does not break an older client.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


class SupportedModel(_Response):
    """A base model the server serves (``model_name`` is what ``model_id`` maps to)."""

    model_name: str
    max_context_length: int | None = None
    trainable: bool = False
    sampleable: bool = False


class ServerCapabilities(_Response):
    """What ``TwinkleClient.get_server_capabilities()`` returns."""

    supported_models: list[SupportedModel] = Field(default_factory=list)


class TrainingRun(_Response):
    """One adapter's training run (created by ``add_adapter_to_model``)."""

    training_run_id: str
    base_model: str | None = None
    model_owner: str | None = None
    is_lora: bool = True
    corrupted: bool = False
    lora_rank: int | None = None
    last_request_time: str | None = None
    last_checkpoint: Any = None
    last_sampler_checkpoint: Any = None
    user_metadata: dict[str, Any] | None = None
    status: str | None = None


class Cursor(_Response):
    offset: int = 0
    limit: int = 0
    total_count: int = 0


class Checkpoint(_Response):
    """A saved checkpoint; ``twinkle_path`` is what ``model.resume_from_checkpoint`` and
    ``sampler.sample(adapter_uri=...)`` take."""

    checkpoint_id: str
    twinkle_path: str
    checkpoint_type: str | None = None
    training_run_id: str | None = None
    time: str | None = None
    size_bytes: int | None = None
    public: bool = False
    expires_at: str | None = None


class TrainConfigs(_Response):
    """A tenant's training configuration, as ``get_train_configs()`` reports it."""

    adapter_name: str
    model_id: str
    lora: dict[str, Any] | None = None
    gradient_accumulation_steps: int = 1
    loss: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    lr_scheduler: dict[str, Any] | None = None
    template: str | None = None
    processor: dict[str, Any] | None = None


__all__ = [
    "Checkpoint",
    "Cursor",
    "ServerCapabilities",
    "SupportedModel",
    "TrainConfigs",
    "TrainingRun",
]
