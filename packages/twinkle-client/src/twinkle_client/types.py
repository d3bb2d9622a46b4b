"""Responses of the management API: capabilities, route table, training runs and checkpoints.

Responses are tolerant (unknown fields are kept, missing optional ones default), so a newer
server does not break an older client.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from twinkle_client.errors import NotFoundError

DEFAULT_GATEWAY = "/api/v1"


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


class RouteTable(_Response):
    """Where the server's applications answer (``GET /api/v1/routes``), as absolute paths.

    Route prefixes are the server's configuration, so the client reads them instead of assuming
    a layout. A server that publishes no table (older versions) uses the default layout
    (``/api/v1/model/<name>``, ``/api/v1/sampler/<name>``, ``/api/v1/processor``), which
    :meth:`default_layout` stands for.

    Attributes:
        gateway: The gateway's prefix.
        models: Model application prefix by base model (``Qwen/Qwen3.5-4B``).
        samplers: Sampler application prefix by base model.
        processors: Processor application prefixes; remote datasets use the first.
    """

    gateway: str = DEFAULT_GATEWAY
    models: dict[str, str] = Field(default_factory=dict)
    samplers: dict[str, str] = Field(default_factory=dict)
    processors: list[str] = Field(default_factory=list)
    _published: bool = PrivateAttr(default=True)

    @classmethod
    def default_layout(cls) -> RouteTable:
        """The layout of a server that publishes no route table."""
        table = cls()
        table._published = False
        return table

    @property
    def published(self) -> bool:
        """``False`` for :meth:`default_layout`."""
        return self._published

    def model_route(self, model_name: str) -> str:
        """The prefix of the model application training ``model_name``.

        Raises:
            NotFoundError: The server trains no such base model (the message lists those it does).
        """
        if not self._published:
            return f"{self.gateway}/model/{model_name}"
        return _lookup(self.models, model_name, "trains")

    def sampler_route(self, model_name: str) -> str:
        """The prefix of the sampler application of ``model_name``.

        Raises:
            NotFoundError: The server samples no such base model.
        """
        if not self._published:
            return f"{self.gateway}/sampler/{model_name}"
        return _lookup(self.samplers, model_name, "samples")

    def processor_route(self) -> str:
        """The prefix of the processor application (remote datasets).

        Raises:
            NotFoundError: The server runs no processor application.
        """
        if not self._published:
            return f"{self.gateway}/processor"
        if not self.processors:
            raise NotFoundError(
                "this server runs no processor application (remote datasets need one)", status=404
            )
        return self.processors[0]

    def is_model_route(self, route: str) -> bool:
        """Whether ``route`` is a model application's prefix."""
        if not self._published:
            return route.startswith(f"{self.gateway}/model/")
        return route in self.models.values()


def _lookup(routes: dict[str, str], model_name: str, verb: str) -> str:
    if model_name not in routes:
        raise NotFoundError(
            f"unknown base model {model_name!r}; this server {verb}: {', '.join(routes) or 'none'}",
            status=404,
        )
    return routes[model_name]


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
    """Where a page of ``list_training_runs_with_cursor`` sits in the whole list."""

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


class CapacityInfo(_Response):
    """Adapter slots of the server (``TwinkleClient.get_capacity_info()``), summed over its
    trainable base models; ``models`` has the same three numbers per base model."""

    max_loras: int = 0
    used_loras: int = 0
    free_loras: int = 0
    models: dict[str, dict[str, int]] = Field(default_factory=dict)


class WeightsInfo(_Response):
    """What a ``twinkle://`` checkpoint path holds (``TwinkleClient.get_weights_info``)."""

    training_run_id: str
    base_model: str | None = None
    model_owner: str | None = None
    is_lora: bool = True
    lora_rank: int | None = None
    checkpoint_id: str | None = None
    checkpoint_type: str | None = None
    twinkle_path: str | None = None
    lora_config: dict[str, Any] | None = None


class DeleteCheckpointResponse(_Response):
    """What ``TwinkleClient.delete_checkpoint`` returns: ``success`` and the deleted path."""

    success: bool
    message: str = ""
    twinkle_path: str | None = None


class SavedCheckpoint(str):
    """What ``model.save()`` returns: the checkpoint's path as a plain string, with attributes.

    It *is* the path (``str``), so code that uses the return value as a path keeps working, and
    it has ``twinkle_path`` like ModelScope Twinkle's ``SaveResponse``. From a server the path is
    ``twinkle://<run>/<kind>/<name>``; from a local model it is the checkpoint directory, which is
    what a local sampler's ``adapter_uri`` and ``load()`` take.

    Attributes:
        twinkle_path: The path (the string itself).
        checkpoint_dir: The checkpoint directory on this machine (``None`` for a server's
            checkpoint: where the server stores it is not the client's business).
        checkpoint_type: ``weights`` or ``sampler_weights``.
    """

    checkpoint_dir: str | None
    checkpoint_type: str

    def __new__(
        cls,
        path: str,
        checkpoint_dir: str | None = None,
        checkpoint_type: str = "weights",
    ) -> SavedCheckpoint:
        saved = super().__new__(cls, path)
        saved.checkpoint_dir = checkpoint_dir
        saved.checkpoint_type = checkpoint_type
        return saved

    @property
    def twinkle_path(self) -> str:
        return str(self)

    @property
    def path(self) -> str:
        return str(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.checkpoint_dir, self.checkpoint_type))

    def model_dump(self) -> dict[str, Any]:
        """The fields as a dict (the shape of ModelScope Twinkle's ``SaveResponse``)."""
        return {"twinkle_path": str(self), "checkpoint_dir": self.checkpoint_dir}


SaveResponse = SavedCheckpoint
"""ModelScope Twinkle's name for what ``save()`` returns."""


class ForwardOutput(dict):
    """What ``forward_only`` (and ``forward``) returns: the output dict itself (``loss``,
    ``logprobs``, ...), also reachable as ``.result`` like ModelScope Twinkle's
    ``ForwardResponse``, so ``model.forward_backward(..., ref_outputs=out.result)`` and
    ``out['logprobs']`` both work."""

    @property
    def result(self) -> ForwardOutput:
        return self


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
    "CapacityInfo",
    "Checkpoint",
    "Cursor",
    "DeleteCheckpointResponse",
    "ForwardOutput",
    "RouteTable",
    "SaveResponse",
    "SavedCheckpoint",
    "ServerCapabilities",
    "SupportedModel",
    "TrainConfigs",
    "TrainingRun",
    "WeightsInfo",
]
