"""The ``sampler`` application as a Ray Serve deployment (``SamplerManagement``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, FastAPI
from ray import serve

from twinkle.server.config import ApplicationConfig, ServerConfig, base_model_name
from twinkle.server.context import build_context
from twinkle.server.process.threads import build_on_model_thread, cpu_threads
from twinkle.server.ratelimit import RateLimiter
from twinkle.server.sampler.service import SampleLimits, SamplerService
from twinkle.server.telemetry import serve_traced, setup_telemetry
from twinkle.server.web.bind import bind_router, bound
from twinkle.server.web.http import (
    DEFAULT_MAX_REQUEST_BYTES,
    Authenticator,
    install_error_handlers,
)
from twinkle.server.web.openapi_bodies import document_bodies, sampler_bodies
from twinkle.server.web.operations import operation_routes

_SAMPLER_CLASSES = {"torch": "TorchSampler", "vllm": "vLLMSampler", "mock": "MockSampler"}


def create_sampler(
    app_config: ApplicationConfig,
    storage_root,
    max_length: int | None = None,
    server_config: ServerConfig | None = None,
) -> Any:
    """The sampler for ``sampler_type`` (torch, vllm, mock); with ``device_mesh.dp_size`` N > 1,
    N replicas as Ray actors (``twinkle.parallel.DataParallelSampler``), requests spread over them.
    ``max_length`` bounds prompt plus completion (:class:`SampleLimits`); a torch sampler's
    memory budget defaults from ``server_config``, shared by its data-parallel ranks
    (:func:`twinkle.server.process.placement.process_memory_budget_mb`)."""
    args = app_config.args
    if args.sampler_type not in _SAMPLER_CLASSES:
        raise ValueError(f"unknown sampler_type {args.sampler_type!r}; use torch, vllm or mock")
    kwargs: dict[str, Any] = {
        "allowed_adapter_dirs": [str(storage_root)],
        "max_length": max_length,
    }
    if args.sampler_type == "torch":
        kwargs["max_loras"] = args.max_loras
        from twinkle.server.process.placement import process_memory_budget_mb

        kwargs["options"] = args.execution.options().replace(
            memory_budget_mb=process_memory_budget_mb(app_config, server_config)
        )
    mesh = args.device_mesh
    if args.sampler_type == "vllm":
        kwargs["engine_args"] = dict(args.engine_args)
        if mesh is not None and mesh.tp_size > 1:
            kwargs["engine_args"].setdefault("tensor_parallel_size", mesh.tp_size)
    if mesh is not None and mesh.dp_size > 1:
        from twinkle.parallel import DataParallelSampler
        from twinkle.server.process.placement import worker_options

        placement = worker_options(app_config)
        return DataParallelSampler(
            _SAMPLER_CLASSES[args.sampler_type],
            mesh.dp_size,
            model_id=args.model_id,
            **placement,
            **kwargs,
        )
    import twinkle.sampler

    return getattr(twinkle.sampler, _SAMPLER_CLASSES[args.sampler_type])(args.model_id, **kwargs)


def build_sampler_service(app_config: ApplicationConfig, context) -> SamplerService:
    args = app_config.args
    limits = SampleLimits.of(args, context.config)
    root = context.storage_root.resolve()
    executor = None
    if args.device_mesh is None or args.device_mesh.dp_size == 1:
        # In-process engine: built on the one thread that will run it (see ``model_thread``).
        sampler, executor = build_on_model_thread(
            lambda: create_sampler(app_config, root, limits.max_length, context.config),
            cpu_threads(app_config) if args.sampler_type != "mock" else None,
            keep_memory=args.sampler_type == "torch" and args.execution.options().malloc_tuning,
        )
    else:
        sampler = create_sampler(app_config, root, limits.max_length, context.config)

    def resolve(owner: str, path: str):
        return context.state.resolve_checkpoint_path(owner, path, allow_public=True).local_dir

    queue = args.queue_config
    return SamplerService(
        sampler,
        base_model_name(args.model_id),
        resolve,
        RateLimiter(queue.rps_limit, queue.tps_limit, queue.max_input_tokens),
        executor=executor,
        limits=limits,
    )


router = APIRouter()
Service = Annotated[SamplerService, bound("sampler_service")]


@router.get("/healthz")
async def healthz(service: Service) -> dict:
    return {"status": "ok", "base_model": service.base_model}


def create_sampler_app(
    service: SamplerService,
    authenticate: Authenticator,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> FastAPI:
    """``POST /sample``, ``/set_template``, ``/publish_adapter`` and ``/add_adapter_to_sampler``
    with JSON bodies (:func:`twinkle.server.web.operations.operation_routes`); ``GET /healthz`` (:data:`router`'s)."""
    app = FastAPI(title=f"Twinkle sampler {service.base_model}")
    install_error_handlers(app)
    document_bodies(app, sampler_bodies, expand="/{op}")
    app.include_router(bind_router(router, sampler_service=service))
    app.include_router(operation_routes(service, authenticate, max_request_bytes))
    return app


@serve.ingress()
class SamplerManagement:
    """One replica: a sampler over the base model, adapters loaded by checkpoint path."""

    def __init__(self, app_config: dict[str, Any], server_config: dict[str, Any]) -> None:
        self.config = ServerConfig.model_validate(server_config)
        self.app_config = ApplicationConfig.model_validate(app_config)
        self.context = build_context(self.config)
        setup_telemetry(self.config.telemetry, "Sampler")
        self.service = build_sampler_service(self.app_config, self.context)

    def __serve_build_asgi_app__(self):
        return create_sampler_app(
            self.service, self.context.authenticate, self.context.server_args.max_request_bytes
        )

    async def call(self, owner: str, op: str, payload: dict[str, Any]) -> Any:
        return await serve_traced("Sampler", self.service.call, owner, op, payload)

    def placement(self) -> dict[str, Any]:
        """Where this replica and its data-parallel ranks run (node, GPUs, resources)."""
        from twinkle.server.process.placement import placement_of

        return placement_of(self.service.sampler)


def build_app(app_config: ApplicationConfig, server_config: ServerConfig):
    """Launch builder for ``import_path: sampler``."""
    from twinkle.server.process.launch import deployment_options

    options = deployment_options(app_config, "SamplerManagement")
    return (
        serve.deployment(SamplerManagement)
        .options(**options)
        .bind(app_config.model_dump(mode="json"), server_config.model_dump(mode="json"))
    )
