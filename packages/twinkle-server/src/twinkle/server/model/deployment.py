"""The ``model`` application as a Ray Serve deployment (``ModelManagement``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ray import serve

from twinkle.server.config import ApplicationConfig, ServerConfig, base_model_name
from twinkle.server.context import build_context
from twinkle.server.hub import HubPublisher
from twinkle.server.model.app import create_model_app
from twinkle.server.model.backend import create_backend
from twinkle.server.model.live_adapter import live_adapter_operations
from twinkle.server.model.operations import native_operations
from twinkle.server.model.registry import StateRunRegistry
from twinkle.server.model.service import ModelService
from twinkle.server.model.tinker_ops import tinker_operations
from twinkle.server.process.placement import (
    megatron_rank_options,
    megatron_world,
    placement_of,
    process_memory_budget_mb,
    worker_options,
)
from twinkle.server.process.threads import build_on_model_thread, cpu_threads
from twinkle.server.ratelimit import RateLimiter
from twinkle.server.telemetry import ModelTaskMetrics, serve_traced, setup_telemetry
from twinkle.server.web.http import StartOnFirstRequest


def build_service(app_config: ApplicationConfig, context) -> ModelService:
    """A ModelService for one ``model`` application of the config.

    The model is built on the thread that will run every call on it (see
    :func:`~twinkle.server.process.threads.model_thread`).
    """
    args = app_config.args
    kwargs: dict[str, Any] = {}
    if args.torch_dtype and args.torch_dtype != "auto" and args.backend == "transformers":
        kwargs["torch_dtype"] = args.torch_dtype
    mesh = args.device_mesh
    one_world = megatron_world(app_config)
    if mesh is not None and mesh.dp_size > 1:
        kwargs["dp_size"] = mesh.dp_size
        if not one_world:  # Ray replicas (DataParallelModel)
            kwargs.update(device_type=mesh.device_type, worker_options=worker_options(app_config))
    if one_world:
        # megatron's worker ranks, dp x pp x tp in one world (preflight checked the rest): Ray
        # actors inside Ray Serve, placed over the cluster; spawned processes under --local
        kwargs.update(
            tp_size=mesh.tp_size,
            pp_size=mesh.pp_size,
            ray_options=megatron_rank_options(app_config),
        )
        if mesh.ep_size > 1:
            # dp_size == ep_size (preflight): the expert ranks are the world's dp ranks, so the
            # world is ep_size ranks, each running its share of the rows
            kwargs.pop("dp_size", None)
            kwargs["ep_size"] = mesh.ep_size
    torch_backend = args.backend != "mock"
    options = args.execution.options().replace(
        memory_budget_mb=process_memory_budget_mb(app_config, getattr(context, "config", None))
    )
    if torch_backend:
        kwargs["options"] = options
    model, executor = build_on_model_thread(
        lambda: create_backend(args.backend, args.model_id, **kwargs),
        cpu_threads(app_config) if torch_backend else None,
        keep_memory=torch_backend and options.malloc_tuning,
    )
    gateway = context.server_args
    registry = StateRunRegistry(
        context.state,
        context.storage_root,
        keep_last=gateway.keep_last_checkpoints,
        checkpoint_ttl_s=gateway.checkpoint_ttl_s,
    )
    queue = args.queue_config
    metrics = ModelTaskMetrics(base_model_name(args.model_id))
    service = ModelService(
        model,
        base_model_name(args.model_id),
        registry,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        per_token_model_limit=gateway.server_config.per_token_model_limit,
        adapter_timeout=args.adapter_config.adapter_timeout,
        adapter_max_lifetime=args.adapter_config.adapter_max_lifetime,
        rate_limiter=RateLimiter(queue.rps_limit, queue.tps_limit, queue.max_input_tokens),
        max_fused=queue.max_fused_tenants,
        fuse_wait_s=queue.max_fuse_wait_ms / 1000,
        max_length=args.max_length,
        on_task_done=metrics.on_task_done,
        executor=executor,
        operations=native_operations() + tinker_operations() + live_adapter_operations(),
        hub=HubPublisher.from_config(context.config.hub),
        adapter_paging=args.adapter_paging,
        max_paged_adapters=args.max_paged_adapters,
        paging_storage=Path(context.storage_root) / "paging" / base_model_name(args.model_id),
        max_paged_host_bytes=(
            int(args.max_paged_host_mb * 2**20) if args.max_paged_host_mb is not None else None
        ),
    )
    metrics.watch(service)
    return service


async def sweep_forever(service: ModelService, interval_s: float) -> None:
    """Unload idle and expired adapters every ``interval_s`` seconds, then hand the heap's free
    pages back to the OS between two tasks (:func:`twinkle.model.memory.release_freed_memory`:
    the replica keeps freed memory for its next step, which over days of adapters created and
    removed would otherwise creep)."""
    from twinkle.model.memory import release_freed_memory

    while True:
        await asyncio.sleep(interval_s)
        await service.sweep()
        await service.scheduler.between_tasks(release_freed_memory)


async def find_direct_url(app_name: str, route_prefix: str, http_host: str) -> str | None:
    """The address of ``app_name``'s only replica when Serve serves it directly, else ``None``.

    Asks the Serve controller for the application's target group (Ray's direct ingress); with
    direct ingress off it lists only proxies, and a deployment with several replicas has no
    single address (a tenant's adapter lives on one of them), so both give ``None``.
    """
    try:
        import ray
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        groups = await controller.get_target_groups.remote(app_name)
    except Exception:  # noqa: BLE001 - an older Ray, or no controller: the proxy path stays
        return None
    for group in groups:
        protocol = str(getattr(group.protocol, "value", group.protocol)).upper()
        if group.app_name != app_name or group.route_prefix != route_prefix:
            continue
        if protocol != "HTTP" or len(group.targets) != 1:
            continue
        target = group.targets[0]
        # The replica binds to the configured host; the target names the node's address.
        host = target.ip if http_host in ("0.0.0.0", "::") else http_host
        return f"http://[{host}]:{target.port}" if ":" in host else f"http://{host}:{target.port}"
    return None


@serve.ingress()
class ModelManagement:
    """One replica: the shared base model with its LoRA pool, behind HTTP and a handle API."""

    def __init__(self, app_config: dict[str, Any], server_config: dict[str, Any]) -> None:
        self.config = ServerConfig.model_validate(server_config)
        self.app_config = ApplicationConfig.model_validate(app_config)
        self.context = build_context(self.config)
        setup_telemetry(self.config.telemetry, "Model")
        self.service = build_service(self.app_config, self.context)
        self._direct_url: str | None = None

    def __serve_build_asgi_app__(self):
        app = create_model_app(
            self.service,
            self.context.authenticate,
            self.context.server_args.max_request_bytes,
            direct_url=self.direct_url,
            signer=self.context.signer,
        )
        timeout = self.app_config.args.adapter_config.adapter_timeout
        app.add_middleware(
            StartOnFirstRequest,
            start=lambda: sweep_forever(self.service, min(30.0, timeout / 4)),
        )
        return app

    async def direct_url(self) -> str | None:
        """This replica's own HTTP address when Serve runs with direct ingress, else ``None``.

        Every HTTP request through Serve's proxy costs an actor call from the proxy to the
        replica and calls back for the request body and the disconnect; with direct ingress
        (``twinkle-server launch`` turns it on for the Ray it starts) the replica also serves
        its routes on its own port, and clients that know it skip that path.
        """
        if self._direct_url is None:
            self._direct_url = await find_direct_url(
                self.app_config.name, self.app_config.route_prefix, self.config.http_options.host
            )
        return self._direct_url

    async def call(self, owner: str, op: str, payload: dict[str, Any]) -> Any:
        """Handle API for the gateway: the same operations as the HTTP routes."""
        return await serve_traced("Model", self.service.call, owner, op, payload)

    def placement(self) -> dict[str, Any]:
        """Where this replica and its data-parallel ranks run (node, GPUs, resources)."""
        return placement_of(self.service.model)

    async def unload_session(self, session_id: str) -> list[str]:
        """Unload the adapters of a session that stopped heartbeating (gateway housekeeping)."""
        return await self.service.unload_session(session_id)


def build_app(app_config: ApplicationConfig, server_config: ServerConfig):
    """Launch builder for ``import_path: model``."""
    from twinkle.server.process.launch import deployment_options

    options = deployment_options(app_config, "ModelManagement")
    deployment = serve.deployment(ModelManagement).options(**options)
    return deployment.bind(
        app_config.model_dump(mode="json"), server_config.model_dump(mode="json")
    )
