"""Every application of a config in ONE process and one ASGI app, without Ray.

Each application's FastAPI app is mounted at its ``route_prefix`` (longest first, as Serve routes)
and the gateway reaches the model and sampler services directly. Tests drive it through
``httpx.ASGITransport``; ``twinkle-server launch --local`` serves it with uvicorn.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount

from twinkle.server.config import (
    ModelArgs,
    ProcessorArgs,
    SamplerArgs,
    ServerArgs,
    ServerConfig,
    base_model_name,
)
from twinkle.server.context import ServerContext, build_context
from twinkle.server.gateway.backends import Backends, LocalClient
from twinkle.server.process.launch import LaunchError
from twinkle.server.sampler.protocol import SampleLimits
from twinkle.server.telemetry import (
    TracedClient,
    TracedService,
    publish_resource_gauges,
    setup_telemetry,
)


@dataclass
class LocalServer:
    """The mounted app plus the services behind it (for tests to inspect)."""

    app: Starlette
    context: ServerContext
    backends: Backends
    services: dict[str, Any] = field(default_factory=dict)


def build_local_server(config: ServerConfig, store: Any = None) -> LocalServer:
    """Build every application of ``config`` in this process."""
    from twinkle.server.gateway.app import create_gateway_app
    from twinkle.server.model.app import create_model_app
    from twinkle.server.model.deployment import build_service

    ctx = build_context(config, store=store)
    setup_telemetry(config.telemetry, "Gateway")
    publish_resource_gauges(ctx)
    backends = Backends()
    services: dict[str, Any] = {}
    mounts: list[tuple[str, Any]] = []
    for app_config in config.applications:
        args = app_config.args
        if isinstance(args, ModelArgs):
            service = build_service(app_config, ctx)
            backends.models[base_model_name(args.model_id)] = TracedClient(
                LocalClient(TracedService(service, "Model"))
            )
            backends.max_context[base_model_name(args.model_id)] = args.max_length
            backends.max_lora_rank[base_model_name(args.model_id)] = args.max_lora_rank
            mounts.append(
                (
                    app_config.route_prefix,
                    create_model_app(
                        service,
                        ctx.authenticate,
                        ctx.server_args.max_request_bytes,
                        signer=ctx.signer,
                    ),
                )
            )
            services[app_config.name] = service
        elif isinstance(args, SamplerArgs):
            from twinkle.server.sampler.deployment import build_sampler_service, create_sampler_app

            service = build_sampler_service(app_config, ctx)
            backends.samplers[base_model_name(args.model_id)] = TracedClient(
                LocalClient(TracedService(service, "Sampler"))
            )
            backends.sample_limits[base_model_name(args.model_id)] = SampleLimits.of(args, config)
            mounts.append(
                (
                    app_config.route_prefix,
                    create_sampler_app(
                        service, ctx.authenticate, ctx.server_args.max_request_bytes
                    ),
                )
            )
            services[app_config.name] = service
        elif isinstance(args, ProcessorArgs):
            from twinkle.server.processor.app import create_processor_app

            mounts.append(
                (
                    app_config.route_prefix,
                    create_processor_app(ctx.authenticate, ctx.server_args.max_request_bytes),
                )
            )
    for app_config in config.applications:
        if app_config.import_path == "server" or isinstance(app_config.args, ServerArgs):
            mounts.append((app_config.route_prefix, create_gateway_app(ctx, backends)))
    mounts.sort(key=lambda m: len(m[0]), reverse=True)
    from twinkle.server.web.http import http_error

    app = Starlette(
        routes=[Mount(prefix.rstrip("/"), app=sub) for prefix, sub in mounts],
        exception_handlers={404: http_error, 405: http_error},
    )
    return LocalServer(app, ctx, backends, services)


async def maintain_forever(server: LocalServer, config: ServerConfig) -> None:
    """The background work the Serve replicas run, for a one-process server: the gateway's
    housekeeping (session expiry, checkpoint TTLs and snapshot sweep, futures purge) and each
    model's sweep of idle and expired adapters."""
    import asyncio

    from twinkle.server.gateway.app import housekeeping_forever
    from twinkle.server.model.deployment import sweep_forever

    jobs = [housekeeping_forever(server.context, server.backends)]
    for app_config in config.applications:
        if isinstance(app_config.args, ModelArgs) and app_config.name in server.services:
            timeout = app_config.args.adapter_config.adapter_timeout
            jobs.append(sweep_forever(server.services[app_config.name], min(30.0, timeout / 4)))
    await asyncio.gather(*jobs)


def serve_local(config: ServerConfig) -> None:
    """Serve ``config`` from this process on its ``http_options`` address until interrupted."""
    import uvicorn

    from twinkle.server.web.http import StartOnFirstRequest

    host, port = config.http_options.host, config.http_options.port
    # Bound before anything is built or printed: a port another process holds is an error that
    # says so, never a "serving on" line for an address this process does not serve.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise LaunchError(f"cannot serve on {host}:{port}: {error.strerror}") from error
    server = build_local_server(config)
    app = StartOnFirstRequest(server.app, start=lambda: maintain_forever(server, config))
    print(f"Twinkle server (local mode) on http://{host}:{port}/api/v1", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
