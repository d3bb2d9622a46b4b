"""OpenTelemetry SDK providers for :func:`setup_telemetry`: OTLP gRPC or console exporters."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)

_globals_set = False


def build_resource(config: Any, component: str) -> Resource:
    """``service.name`` + ``resource_attributes`` + ``twinkle.component``."""
    return Resource.create(
        {
            "service.name": config.service_name,
            **config.resource_attributes,
            "twinkle.component": component,
        }
    )


def build_providers(
    config: Any,
    component: str,
    *,
    metric_readers: Sequence[Any] | None = None,
    span_exporters: Sequence[Any] | None = None,
) -> tuple[Any, Any, Callable[[], None]]:
    """Meter and tracer providers (and, with real exporters, log export on the ``twinkle`` logger)."""
    global _globals_set
    resource = build_resource(config, component)
    overridden = metric_readers is not None or span_exporters is not None
    insecure = not config.otlp_endpoint.startswith("https://")
    if metric_readers is None:
        metric_readers = (
            []
            if overridden
            else [
                PeriodicExportingMetricReader(
                    _metric_exporter(config, insecure),
                    export_interval_millis=config.export_interval_ms,
                )
            ]
        )
    tracer_provider = TracerProvider(resource=resource)
    if span_exporters is not None:
        for exporter in span_exporters:
            tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif config.debug:
        tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stdout)))
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint, insecure=insecure))
        )
    meter_provider = MeterProvider(resource=resource, metric_readers=list(metric_readers))
    detach_logs = (lambda: None) if overridden else _export_logs(config, resource, insecure)
    if not overridden and not _globals_set:
        # Other instrumented libraries in the process report through the same pipeline.
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        _globals_set = True

    def shutdown() -> None:
        detach_logs()
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return meter_provider, tracer_provider, shutdown


def _metric_exporter(config: Any, insecure: bool) -> Any:
    if config.debug:
        return ConsoleMetricExporter(out=sys.stdout)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=config.otlp_endpoint, insecure=insecure)


def _export_logs(config: Any, resource: Resource, insecure: bool) -> Callable[[], None]:
    """Send records of the ``twinkle`` logger through OpenTelemetry; returns the undo."""
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter

    if config.debug:
        exporter = ConsoleLogRecordExporter(out=sys.stdout)
    else:
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        exporter = OTLPLogExporter(endpoint=config.otlp_endpoint, insecure=insecure)
    provider = LoggerProvider(resource=resource)
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    with (
        warnings.catch_warnings()
    ):  # the SDK handler is deprecated for a contrib package we do not ship
        warnings.simplefilter("ignore", DeprecationWarning)
        handler = LoggingHandler(level=logging.NOTSET, logger_provider=provider)
    twinkle_logger = logging.getLogger("twinkle")
    twinkle_logger.addHandler(handler)

    def detach() -> None:
        twinkle_logger.removeHandler(handler)
        provider.shutdown()

    return detach
