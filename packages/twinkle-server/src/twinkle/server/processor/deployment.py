"""The ``processor`` application as a Ray Serve deployment (``ProcessorManagement``)."""

from __future__ import annotations

from typing import Any

from ray import serve

from twinkle.server.config import ApplicationConfig, ServerConfig
from twinkle.server.context import build_context
from twinkle.server.processor.app import create_processor_app
from twinkle.server.processor.service import ProcessorService
from twinkle.server.telemetry import setup_telemetry


@serve.ingress()
class ProcessorManagement:
    """One replica: tenants' remote datasets, processed on this replica's CPUs."""

    def __init__(self, app_config: dict[str, Any], server_config: dict[str, Any]) -> None:
        self.config = ServerConfig.model_validate(server_config)
        self.app_config = ApplicationConfig.model_validate(app_config)
        setup_telemetry(self.config.telemetry, "Processor")
        self.context = build_context(self.config)
        self.service = ProcessorService(max_num_proc=self.app_config.args.ncpu_proc_per_node)

    def placement(self) -> dict[str, Any]:
        """Where this replica runs (node, resources)."""
        from twinkle.server.process.placement import placement_of

        return placement_of(self.service)

    def __serve_build_asgi_app__(self):
        return create_processor_app(
            self.context.authenticate,
            self.context.server_args.max_request_bytes,
            service=self.service,
        )

    async def call(self, owner: str, op: str, payload: dict[str, Any]) -> Any:
        return await self.service.call(owner, op, payload)


def build_app(app_config: ApplicationConfig, server_config: ServerConfig):
    """Launch builder for ``import_path: processor``."""
    from twinkle.server.process.launch import deployment_options

    options = deployment_options(app_config, "ProcessorManagement")
    return (
        serve.deployment(ProcessorManagement)
        .options(**options)
        .bind(app_config.model_dump(mode="json"), server_config.model_dump(mode="json"))
    )
