"""The ``server`` application as a Ray Serve deployment (``TinkerCompatServer``)."""

from __future__ import annotations

from typing import Any

from ray import serve

from twinkle.server.config import (
    ApplicationConfig,
    ModelArgs,
    SamplerArgs,
    ServerConfig,
    base_model_name,
)
from twinkle.server.context import build_context
from twinkle.server.gateway.app import create_gateway_app, housekeeping_forever
from twinkle.server.gateway.backends import Backends, HandleClient
from twinkle.server.sampler.protocol import SampleLimits
from twinkle.server.telemetry import TracedClient, publish_resource_gauges, setup_telemetry
from twinkle.server.web.http import StartOnFirstRequest

DEPLOYMENT_NAMES = {"model": "ModelManagement", "sampler": "SamplerManagement"}


def handle_backends(config: ServerConfig) -> Backends:
    """Backends that reach every model and sampler application of ``config`` through Serve handles."""
    backends = Backends()
    for app in config.applications:
        if isinstance(app.args, ModelArgs):
            name = base_model_name(app.args.model_id)
            backends.models[name] = TracedClient(HandleClient(DEPLOYMENT_NAMES["model"], app.name))
            backends.max_context[name] = app.args.max_length
            backends.max_lora_rank[name] = app.args.max_lora_rank
        elif isinstance(app.args, SamplerArgs):
            name = base_model_name(app.args.model_id)
            backends.samplers[name] = TracedClient(
                HandleClient(DEPLOYMENT_NAMES["sampler"], app.name)
            )
            backends.sample_limits[name] = SampleLimits.of(app.args, config)
    return backends


@serve.ingress()
class TinkerCompatServer:
    """The gateway replica: auth, sessions, runs, checkpoints, futures; Twinkle and Tinker APIs."""

    def __init__(self, server_config: dict[str, Any]) -> None:
        self.config = ServerConfig.model_validate(server_config)
        self.context = build_context(self.config)
        setup_telemetry(self.config.telemetry, "Gateway")
        publish_resource_gauges(self.context)
        self.backends = handle_backends(self.config)

    def __serve_build_asgi_app__(self):
        app = create_gateway_app(self.context, self.backends)
        app.add_middleware(
            StartOnFirstRequest,
            start=lambda: housekeeping_forever(self.context, self.backends),
        )
        return app


def build_app(app_config: ApplicationConfig, server_config: ServerConfig):
    """Launch builder for ``import_path: server``."""
    from twinkle.server.process.launch import deployment_options

    options = deployment_options(app_config, "TinkerCompatServer")
    return (
        serve.deployment(TinkerCompatServer)
        .options(**options)
        .bind(server_config.model_dump(mode="json"))
    )
