"""The metric names, kinds and Prometheus names are public API: pinned here."""

import twinkle.server.telemetry as telemetry
from twinkle.server.telemetry import METRICS, prometheus_name

EXPECTED = {
    "twinkle.http.requests.total": ("counter", "twinkle_http_requests_total"),
    "twinkle.http.request.duration_seconds": ("histogram", "twinkle_http_request_duration_seconds"),
    "twinkle.queue.depth": ("observable_gauge", "twinkle_queue_depth"),
    "twinkle.task.execution_seconds": ("histogram", "twinkle_task_execution_seconds"),
    "twinkle.task.wait_seconds": ("histogram", "twinkle_task_wait_seconds"),
    "twinkle.rate_limit.rejections.total": ("counter", "twinkle_rate_limit_rejections_total"),
    "twinkle.tasks.total": ("counter", "twinkle_tasks_total"),
    "twinkle.sessions.active": ("observable_gauge", "twinkle_sessions_active"),
    "twinkle.models.active": ("observable_gauge", "twinkle_models_active"),
    "twinkle.sampling_sessions.active": ("observable_gauge", "twinkle_sampling_sessions_active"),
    "twinkle.futures.active": ("observable_gauge", "twinkle_futures_active"),
    "twinkle.train.loss": ("gauge", "twinkle_train_loss"),
    "twinkle.train.steps.total": ("counter", "twinkle_train_steps_total"),
    "twinkle.train.tokens.total": ("counter", "twinkle_train_tokens_total"),
}


def test_metric_names_kinds_and_prometheus_names_are_pinned():
    assert {m.name: (m.kind, m.prometheus_name) for m in METRICS} == EXPECTED


def test_prometheus_mapping_adds_total_to_counters_only_once():
    assert prometheus_name("a.b.c", "counter") == "a_b_c_total"
    assert prometheus_name("a.b.total", "counter") == "a_b_total"
    assert prometheus_name("a.b", "observable_gauge") == "a_b"


def test_public_surface():
    assert set(telemetry.__all__) == {
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
    }
    assert telemetry.COMPONENTS == ("Gateway", "Model", "Sampler", "Processor")


def test_component_for_path():
    assert telemetry.component_for_path("/api/v1/model/tiny/qwen3/forward_backward") == "Model"
    assert telemetry.component_for_path("/api/v1/sampler/tiny/qwen3/sample") == "Sampler"
    assert telemetry.component_for_path("/api/v1/processor/encode") == "Processor"
    assert telemetry.component_for_path("/api/v1/create_session") == "Gateway"
