"""Every metric the server exports: OpenTelemetry name, kind, unit, and its Prometheus name.

The names are part of the public API (dashboards and alerts are written against them); a test
pins them. Prometheus' OTLP receiver turns dots into underscores and appends ``_total`` to
monotonic counters; histograms become ``_bucket``/``_sum``/``_count`` series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "histogram", "gauge", "observable_gauge"]

SECONDS_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


@dataclass(frozen=True)
class MetricSpec:
    """One instrument: ``name`` (OpenTelemetry), ``kind``, ``unit`` and what it measures."""

    name: str
    kind: Kind
    unit: str
    description: str

    @property
    def prometheus_name(self) -> str:
        """The series name a Prometheus-compatible backend stores (histograms: the base name)."""
        return prometheus_name(self.name, self.kind)


def prometheus_name(name: str, kind: Kind) -> str:
    """``twinkle.http.requests.total`` -> ``twinkle_http_requests_total`` (counters end in ``_total``)."""
    flat = name.replace(".", "_")
    if kind == "counter" and not flat.endswith("_total"):
        flat += "_total"
    return flat


HTTP_REQUESTS = MetricSpec(
    "twinkle.http.requests.total",
    "counter",
    "{request}",
    "HTTP requests served, by component, route, method and status",
)
HTTP_DURATION = MetricSpec(
    "twinkle.http.request.duration_seconds",
    "histogram",
    "s",
    "HTTP request latency, by component, route, method and status",
)
QUEUE_DEPTH = MetricSpec(
    "twinkle.queue.depth",
    "observable_gauge",
    "{task}",
    "Tasks queued (not yet started) on a model deployment",
)
TASK_EXECUTION = MetricSpec(
    "twinkle.task.execution_seconds",
    "histogram",
    "s",
    "Time a task ran on the model worker, by operation",
)
TASK_WAIT = MetricSpec(
    "twinkle.task.wait_seconds",
    "histogram",
    "s",
    "Time a task waited in its tenant's queue before it ran",
)
RATE_LIMIT_REJECTIONS = MetricSpec(
    "twinkle.rate_limit.rejections.total",
    "counter",
    "{request}",
    "Requests refused with HTTP 429 by a per-tenant rate limit",
)
TASKS = MetricSpec(
    "twinkle.tasks.total",
    "counter",
    "{task}",
    "Finished tasks by operation and outcome (ok / error)",
)
SESSIONS_ACTIVE = MetricSpec(
    "twinkle.sessions.active",
    "observable_gauge",
    "{session}",
    "Sessions that have not finished (published by the cleanup leader)",
)
MODELS_ACTIVE = MetricSpec(
    "twinkle.models.active",
    "observable_gauge",
    "{model}",
    "Training runs whose adapter is loaded (published by the cleanup leader)",
)
SAMPLING_SESSIONS_ACTIVE = MetricSpec(
    "twinkle.sampling_sessions.active",
    "observable_gauge",
    "{session}",
    "Sampling sessions (published by the cleanup leader)",
)
FUTURES_ACTIVE = MetricSpec(
    "twinkle.futures.active",
    "observable_gauge",
    "{future}",
    "Futures still pending (published by the cleanup leader)",
)
TRAIN_LOSS = MetricSpec(
    "twinkle.train.loss",
    "gauge",
    "",
    "Last training loss of each tenant (a hashed id), from its most recently trained adapter",
)
TRAIN_STEPS = MetricSpec(
    "twinkle.train.steps.total", "counter", "{step}", "Optimizer steps taken, per tenant"
)
TRAIN_TOKENS = MetricSpec(
    "twinkle.train.tokens.total",
    "counter",
    "{token}",
    "Input tokens trained on (forward passes), per tenant",
)

METRICS: tuple[MetricSpec, ...] = (
    HTTP_REQUESTS,
    HTTP_DURATION,
    QUEUE_DEPTH,
    TASK_EXECUTION,
    TASK_WAIT,
    RATE_LIMIT_REJECTIONS,
    TASKS,
    SESSIONS_ACTIVE,
    MODELS_ACTIVE,
    SAMPLING_SESSIONS_ACTIVE,
    FUTURES_ACTIVE,
    TRAIN_LOSS,
    TRAIN_STEPS,
    TRAIN_TOKENS,
)

RESOURCE_GAUGES: dict[str, MetricSpec] = {
    "active_sessions": SESSIONS_ACTIVE,
    "models": MODELS_ACTIVE,
    "sampling_sessions": SAMPLING_SESSIONS_ACTIVE,
    "futures": FUTURES_ACTIVE,
}
"""``ServerState.counts()`` key -> the gauge that publishes it."""

COMPONENTS = ("Gateway", "Model", "Sampler", "Processor")
