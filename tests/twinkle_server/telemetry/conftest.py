"""Fixtures: a fresh in-memory telemetry pipeline per test, and the in-process server helpers."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_capture import Captured  # noqa: E402

from twinkle.server.config import TelemetryConfig  # noqa: E402
from twinkle.server.telemetry import setup_telemetry, shutdown_telemetry  # noqa: E402


@pytest.fixture
def captured():
    shutdown_telemetry()
    reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
    telemetry = setup_telemetry(
        TelemetryConfig(enabled=True, export_interval_ms=1000),
        "Gateway",
        metric_readers=[reader],
        span_exporters=[spans],
    )
    yield Captured(telemetry, reader, spans)
    shutdown_telemetry()
