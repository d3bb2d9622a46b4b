"""The ``args`` of each application kind: ``server``, ``model``, ``sampler``, ``processor``."""

from __future__ import annotations

import dataclasses
import logging
import typing
from typing import Any, Literal

from pydantic import Field, create_model, model_validator

from twinkle.model.options import ExecutionOptions
from twinkle.server.config import _upstream
from twinkle.server.config._base import StrictModel, fail, raise_if
from twinkle.server.config.devices import DeviceGroup, DeviceMesh, placement_problems
from twinkle_client.client import served_model_name

logger = logging.getLogger("twinkle.server.config")

MiB = 1024 * 1024


def base_model_name(model_id: str) -> str:
    """The name a model is served under: its id without the hub scheme.

    ``ms://Qwen/Qwen3.5-4B`` -> ``Qwen/Qwen3.5-4B``, ``tiny://qwen3.5`` -> ``tiny/qwen3.5``,
    a local directory -> its last path component. The client's ``served_model_name`` is the one
    rule, so the routes a client calls are the ones the server mounts.
    """
    return served_model_name(model_id)


#: What a server replica does where the block leaves a field out, beyond the library's
#: docstring of the field (``ExecutionOptions``).
_SERVER_DEFAULTS = {
    "cpu_threads": "torch CPU threads of each replica. Default: OMP_NUM_THREADS where the "
    "deployment's runtime_env sets it, else every core the replica may run on (Ray would give "
    "a replica with fractional num_cpus one thread).",
    "max_pass_tokens": "Most padded tokens one fused training pass holds (default: the "
    "device's; 0: no limit).",
    "activation_recompute": "Decoder-layer recompute in training passes (auto: only where a "
    "pass would not fit).",
    "memory_budget_mb": "Most memory (MiB) a model replica may hold: weights, tenants' states "
    "and a pass's activations (shared equally by its data-parallel or megatron ranks). A batch "
    "over it runs as row chunks or is refused before any work. Default: the replica's Ray memory resource when given, else on a CPU node an equal "
    "share of the node's memory among the config's model replicas "
    "(twinkle.server.process.placement.memory_budget_mb), on a GPU the device's free memory.",
}


class _ExecutionBlock(StrictModel):
    """What :data:`ExecutionConfig` adds to its fields."""

    def options(self) -> ExecutionOptions:
        """The ``ExecutionOptions`` these settings give (unset fields: defaults)."""
        return ExecutionOptions.from_env(**self.model_dump(exclude_none=True))


def _execution_config() -> type[_ExecutionBlock]:
    """The ``execution:`` block, derived from ``ExecutionOptions``: each of its fields, in its
    order, of its type made optional (``None``: the library's default, or the environment's,
    read once when the replica builds its model), with its bounds."""
    hints = typing.get_type_hints(ExecutionOptions)
    fields: dict[str, Any] = {
        option.name: (
            hints[option.name] | None,
            Field(default=None, description=_SERVER_DEFAULTS.get(option.name), **option.metadata),
        )
        for option in dataclasses.fields(ExecutionOptions)
    }
    return create_model(
        "ExecutionConfig",
        __base__=_ExecutionBlock,
        __module__=__name__,
        __doc__=(
            "The ``execution:`` block of a model or sampler: ``twinkle.model.ExecutionOptions``, "
            "every field optional. None of them changes results beyond summation order."
        ),
        **fields,
    )


#: The ``execution:`` block of a model or sampler application. ``ExecutionOptions`` declares the
#: options (their meaning is documented there); this model is derived from it, so the two
#: cannot disagree (``tests/packaging/test_execution_options.py`` also checks the table of
#: docs/server_config.md).
ExecutionConfig = _execution_config()


def _migrate_cpu_threads(kind: str, data: dict) -> None:
    """``cpu_threads`` at the top of ``args`` (earlier releases) -> ``execution.cpu_threads``."""
    if "cpu_threads" not in data:
        return
    legacy = data.pop("cpu_threads")
    execution = dict(data.get("execution") or {})
    given = execution.get("cpu_threads")
    if given is not None and given != legacy:
        fail(
            kind,
            [(("cpu_threads",), f"{legacy} contradicts execution.cpu_threads {given}")],
            legacy,
        )
    logger.warning("args.cpu_threads moved into the execution block: read as execution.cpu_threads")
    execution["cpu_threads"] = legacy
    data["execution"] = execution


class QueueConfig(StrictModel):
    """Admission limits of a model or sampler queue (``None``: unlimited)."""

    rps_limit: float | None = Field(default=None, gt=0, description="requests per second")
    tps_limit: float | None = Field(default=None, gt=0, description="tokens per second per user")
    max_input_tokens: int | None = Field(default=None, gt=0)
    max_fused_tenants: int = Field(default=8, ge=1)
    max_fuse_wait_ms: float = Field(
        default=20,
        ge=0,
        description="longest a fusable group waits for tenants about to send a call (0: never)",
    )

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        return _upstream.migrate_queue(data)


class AdapterConfig(StrictModel):
    """Lifecycle of the LoRA adapters a model holds."""

    adapter_timeout: float = Field(default=1800, gt=0, description="idle seconds before eviction")
    adapter_max_lifetime: float = Field(default=36000, gt=0, description="seconds")


class GatewaySettings(StrictModel):
    """The ``server_config`` block of the gateway (server-wide limits)."""

    per_token_model_limit: int = Field(default=3, ge=1)
    supported_models: list[str] = Field(default_factory=list)


class ServerArgs(StrictModel):
    """Args of the ``server`` (gateway) application."""

    server_config: GatewaySettings = Field(default_factory=GatewaySettings)
    max_request_bytes: int = Field(default=8 * MiB, gt=0)
    rps_limit_per_key: float | None = Field(
        default=None,
        gt=0,
        description="authenticated requests per second per API key on each replica, every route "
        "(bursts up to max(1, rate)); over it a 429 with Retry-After. None: unlimited",
    )
    heartbeat_timeout_s: float = Field(default=60, gt=0)
    future_ttl_s: float = Field(default=3600, gt=0)
    checkpoint_ttl_s: float | None = Field(default=None, gt=0)
    keep_last_checkpoints: int | None = Field(default=None, ge=1)
    max_metadata_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        description="JSON size of one session's user_metadata and tags, or one training run's "
        "user_metadata; over it a 413",
    )
    max_tenant_metadata_bytes: int = Field(
        default=1 * MiB,
        ge=0,
        description="what all of one tenant's kept sessions and runs store as metadata; over it "
        "(after its oldest finished sessions are compacted) a 403",
    )
    keep_finished_sessions: int = Field(
        default=100, ge=1, description="finished sessions kept per tenant (older: compacted)"
    )
    finished_session_ttl_s: float | None = Field(
        default=7 * 86400,
        gt=0,
        description="seconds a finished session is kept after its last heartbeat (None: no TTL)",
    )

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        _upstream.migrate_server_args(data)
        return data


class _PlacedArgs(StrictModel):
    """Args with a ``device_group`` and ``device_mesh`` (declared by each subclass), cross-checked."""

    @model_validator(mode="after")
    def _placement(self):
        raise_if(type(self).__name__, placement_problems(self.device_group, self.device_mesh), None)
        return self


class ModelArgs(_PlacedArgs):
    """Args of a ``model`` application: one base model with a pool of LoRA adapters."""

    backend: Literal["transformers", "megatron", "mock"] = "transformers"
    model_id: str = Field(min_length=1)
    max_length: int | None = Field(default=None, gt=0)
    nproc_per_node: int = Field(default=1, ge=1)
    device_group: DeviceGroup | None = None
    device_mesh: DeviceMesh | None = None
    queue_config: QueueConfig = Field(default_factory=QueueConfig)
    adapter_config: AdapterConfig = Field(default_factory=AdapterConfig)
    max_loras: int = Field(default=8, ge=1)
    """Adapters on the device at once; with ``adapter_paging`` more may be registered."""
    adapter_paging: Literal["host", "storage", "off"] = "host"
    """Where idle adapters go when more than ``max_loras`` are registered: host memory, the
    storage directory, or nowhere (``off``: ``max_loras`` is a wall, 503 past it)."""
    max_paged_adapters: int | None = Field(default=None, ge=0)
    """Adapters paged out at once (None: as many as host memory and storage hold)."""
    max_paged_host_mb: float | None = Field(default=None, gt=0)
    """Host memory paged adapters may hold; past it they go to storage (None: unbounded)."""
    max_lora_rank: int = Field(default=64, ge=1)
    torch_dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = None
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)

    @property
    def base_model_name(self) -> str:
        """``model_id`` without its scheme: the name clients use."""
        return base_model_name(self.model_id)

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        _migrate_use_megatron(data)
        _lift_max_loras(data)
        _migrate_cpu_threads("ModelArgs", data)
        _upstream.migrate_gpus_per_worker("ModelArgs", data)
        return data

    @model_validator(mode="after")
    def _parallelism_needs_megatron(self) -> ModelArgs:
        mesh = self.device_mesh
        if mesh is None or self.backend == "megatron":
            return self
        problems = [
            (("device_mesh", size),
             f"{getattr(mesh, size)} > 1 needs backend 'megatron' (backend is '{self.backend}')")
            for size in ("tp_size", "pp_size", "ep_size")
            if getattr(mesh, size) > 1
        ]  # fmt: skip
        raise_if("ModelArgs", problems, None)
        return self


def _migrate_use_megatron(data: dict) -> None:
    if "use_megatron" not in data:
        return
    legacy = data.pop("use_megatron")
    if not isinstance(legacy, bool):
        fail("ModelArgs", [(("use_megatron",), "must be true or false")], legacy)
    implied = "megatron" if legacy else "transformers"
    given = data.get("backend")
    if given is not None and given != implied:
        fail(
            "ModelArgs",
            [(("use_megatron",), f"{legacy} contradicts backend '{given}'; remove use_megatron")],
            legacy,
        )
    logger.warning("use_megatron is deprecated: read as backend: %s; write that instead", implied)
    data["backend"] = implied


def _lift_max_loras(data: dict) -> None:
    adapter = data.get("adapter_config")
    if not isinstance(adapter, dict) or "max_loras" not in adapter:
        return
    adapter = dict(adapter)
    nested = adapter.pop("max_loras")
    given = data.get("max_loras")
    if given is not None and given != nested:
        fail(
            "ModelArgs",
            [(("adapter_config", "max_loras"), f"{nested} contradicts max_loras {given}")],
            nested,
        )
    logger.warning("adapter_config.max_loras belongs one level up: read as max_loras: %s", nested)
    data["adapter_config"] = adapter
    data["max_loras"] = nested


class SamplerArgs(_PlacedArgs):
    """Args of a ``sampler`` application: generation with adapters loaded by ``adapter_uri``."""

    model_id: str = Field(min_length=1)
    nproc_per_node: int = Field(default=1, ge=1)
    sampler_type: Literal["vllm", "torch", "mock"] = "torch"
    engine_args: dict[str, Any] = Field(default_factory=dict)
    device_group: DeviceGroup | None = None
    device_mesh: DeviceMesh | None = None
    queue_config: QueueConfig = Field(default_factory=QueueConfig)
    max_loras: int = Field(default=8, ge=1)
    max_length: int | None = Field(default=None, gt=0)
    max_num_samples: int = Field(default=128, ge=1, description="most sequences per prompt")
    max_sample_tokens: int = Field(
        default=32768, ge=1, description="largest max_tokens one sampling request may ask"
    )
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)

    @property
    def base_model_name(self) -> str:
        """``model_id`` without its scheme: the name clients use."""
        return base_model_name(self.model_id)

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        _migrate_cpu_threads("SamplerArgs", data)
        _upstream.migrate_gpus_per_worker("SamplerArgs", data)
        return data

    @model_validator(mode="after")
    def _parallelism(self) -> SamplerArgs:
        mesh = self.device_mesh
        if mesh is None:
            return self
        problems = []
        if mesh.tp_size > 1 and self.sampler_type != "vllm":
            problems.append(
                (("device_mesh", "tp_size"), f"{mesh.tp_size} > 1 needs sampler_type 'vllm'")
            )
        for size in ("pp_size", "ep_size"):
            if getattr(mesh, size) > 1:
                problems.append((("device_mesh", size), "a sampler supports only dp and tp"))
        raise_if("SamplerArgs", problems, None)
        return self


class ProcessorArgs(_PlacedArgs):
    """Args of the ``processor`` application (CPU-side dataset processing)."""

    ncpu_proc_per_node: int = Field(default=1, ge=1)
    device_group: DeviceGroup | None = None
    device_mesh: DeviceMesh | None = None

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        _upstream.migrate_processor_queue(data)
        _upstream.migrate_gpus_per_worker("ProcessorArgs", data)
        return data


ARGS_BY_IMPORT_PATH: dict[str, type[StrictModel]] = {
    "server": ServerArgs,
    "model": ModelArgs,
    "sampler": SamplerArgs,
    "processor": ProcessorArgs,
}
