"""setup_telemetry: disabled is a no-op, enabled is idempotent, the resource names the service."""

import logging

from twinkle.server.config import TelemetryConfig
from twinkle.server.telemetry import NOOP, current_telemetry, setup_telemetry, shutdown_telemetry
from twinkle.server.telemetry._exporters import build_resource


def test_disabled_is_the_noop_and_leaves_room_for_a_later_setup():
    shutdown_telemetry()
    assert setup_telemetry(TelemetryConfig(), "Gateway") is NOOP
    assert current_telemetry() is NOOP and not NOOP.enabled
    NOOP.record_http("Gateway", "/x", "GET", 200, 0.1)  # no-op instruments accept calls


def test_enabled_setup_is_idempotent_per_process(captured):
    again = setup_telemetry(TelemetryConfig(enabled=True), "Model")
    assert again is captured.telemetry is current_telemetry()
    assert captured.telemetry.enabled


def test_resource_has_service_name_attributes_and_component():
    config = TelemetryConfig(
        enabled=True,
        service_name="twinkle-prod",
        resource_attributes={"deployment.environment": "ci"},
    )
    attrs = build_resource(config, "Sampler").attributes
    assert attrs["service.name"] == "twinkle-prod"
    assert attrs["deployment.environment"] == "ci"
    assert attrs["twinkle.component"] == "Sampler"


def test_debug_exports_to_the_console(capsys, caplog):
    shutdown_telemetry()
    caplog.set_level(logging.INFO, logger="twinkle")
    telemetry = setup_telemetry(
        TelemetryConfig(enabled=True, debug=True, export_interval_ms=60000), "Gateway"
    )
    try:
        with telemetry.tracer.start_as_current_span("twinkle.server.Gateway"):
            pass
        assert "Worker telemetry initialized" in caplog.text
    finally:
        shutdown_telemetry()
    out = capsys.readouterr().out
    assert '"name": "twinkle.server.Gateway"' in out  # the console span exporter's JSON
