"""OpenTelemetry for the server: traces, metrics and logs with the names of the product docs.

Each deployment calls :func:`setup_telemetry` once; HTTP apps get :func:`install_http_telemetry`
(through ``web.install_error_handlers``); the model deployment records tasks with
:class:`ModelTaskMetrics`; gateway replicas :func:`publish_resource_gauges` under a cleanup-leader
lease; calls between deployments carry the trace context (:class:`TracedClient`, :func:`serve_traced`).
"""

from twinkle.server.telemetry._pipeline import (
    NOOP,
    Telemetry,
    current_telemetry,
    setup_telemetry,
    shutdown_telemetry,
)
from twinkle.server.telemetry.http import (
    HttpTelemetryMiddleware,
    component_for_path,
    install_http_telemetry,
)
from twinkle.server.telemetry.instruments import COMPONENTS, METRICS, MetricSpec, prometheus_name
from twinkle.server.telemetry.leader import LEADER_KEY, LeaderLease
from twinkle.server.telemetry.resources import publish_resource_gauges
from twinkle.server.telemetry.tasks import ModelTaskMetrics, tenant_hash
from twinkle.server.telemetry.tracing import (
    TRACE_KEY,
    TracedClient,
    TracedService,
    inject_trace,
    serve_traced,
)

__all__ = [
    "COMPONENTS",
    "HttpTelemetryMiddleware",
    "LEADER_KEY",
    "LeaderLease",
    "METRICS",
    "MetricSpec",
    "ModelTaskMetrics",
    "NOOP",
    "TRACE_KEY",
    "Telemetry",
    "TracedClient",
    "TracedService",
    "component_for_path",
    "current_telemetry",
    "inject_trace",
    "install_http_telemetry",
    "prometheus_name",
    "publish_resource_gauges",
    "serve_traced",
    "setup_telemetry",
    "shutdown_telemetry",
    "tenant_hash",
]
