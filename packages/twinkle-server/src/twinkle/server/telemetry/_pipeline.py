"""The process's telemetry pipeline: providers, exporters and the instruments of :mod:`.instruments`.

``setup_telemetry`` builds it once per process (every deployment replica calls it; later calls
return the same object). Disabled telemetry is a no-op object with the same surface, so callers
never branch on ``enabled``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from twinkle.server.telemetry import instruments as spec
from twinkle.server.telemetry.leader import LeaderLease

logger = logging.getLogger("twinkle.server.telemetry")


class Telemetry:
    """Tracer and instruments of one process (``enabled=False``: all no-ops).

    Args:
        component: Resource component of this process (Gateway, Model, Sampler, Processor).
        meter_provider: Where metrics go.
        tracer_provider: Where spans go.
        enabled: Whether anything is recorded at all.
        shutdown: Flushes and closes the providers.
    """

    def __init__(
        self,
        component: str,
        meter_provider: Any,
        tracer_provider: Any,
        enabled: bool,
        shutdown: Callable[[], None] = lambda: None,
    ) -> None:
        self.component, self.enabled = component, enabled
        self.meter_provider, self.tracer_provider = meter_provider, tracer_provider
        self._shutdown = shutdown
        self.tracer = tracer_provider.get_tracer("twinkle.server")
        meter = meter_provider.get_meter("twinkle.server")
        self.http_requests = meter.create_counter(**_args(spec.HTTP_REQUESTS))
        self.http_duration = meter.create_histogram(
            **_args(spec.HTTP_DURATION), explicit_bucket_boundaries_advisory=spec.SECONDS_BUCKETS
        )
        self.task_execution = meter.create_histogram(
            **_args(spec.TASK_EXECUTION), explicit_bucket_boundaries_advisory=spec.SECONDS_BUCKETS
        )
        self.task_wait = meter.create_histogram(
            **_args(spec.TASK_WAIT), explicit_bucket_boundaries_advisory=spec.SECONDS_BUCKETS
        )
        self.rate_limit_rejections = meter.create_counter(**_args(spec.RATE_LIMIT_REJECTIONS))
        self.tasks = meter.create_counter(**_args(spec.TASKS))
        self.train_loss = meter.create_gauge(**_args(spec.TRAIN_LOSS))
        self.train_steps = meter.create_counter(**_args(spec.TRAIN_STEPS))
        self.train_tokens = meter.create_counter(**_args(spec.TRAIN_TOKENS))
        self._queues: list[tuple[Callable[[], int], dict[str, str]]] = []
        meter.create_observable_gauge(**_args(spec.QUEUE_DEPTH), callbacks=[self._observe_queues])
        self._resources: tuple[Callable[[], dict[str, int]], LeaderLease | None] | None = None
        self._counts: dict[str, int] | None = None
        for i, (key, metric) in enumerate(spec.RESOURCE_GAUGES.items()):
            meter.create_observable_gauge(
                **_args(metric), callbacks=[self._resource_callback(key, refresh=i == 0)]
            )

    # ------------------------------------------------------------------ recording helpers
    def record_http(
        self, component: str, route: str, method: str, status: int, seconds: float
    ) -> None:
        """One served HTTP request (a 429 also counts as a rate-limit rejection)."""
        attrs = {"component": component, "route": route, "method": method, "status": status}
        self.http_requests.add(1, attrs)
        self.http_duration.record(seconds, attrs)
        if status == 429:
            self.rate_limit_rejections.add(1, {"component": component, "route": route})

    def watch_queue(self, depth: Callable[[], int], **attributes: str) -> None:
        """Publish ``depth()`` as ``twinkle.queue.depth`` with ``attributes`` (component, model)."""
        if self.enabled:
            self._queues.append((depth, attributes))

    def publish_resources(
        self, counts: Callable[[], dict[str, int]], lease: LeaderLease | None
    ) -> None:
        """Publish ``counts()`` (``ServerState.counts``) as the ``*.active`` gauges while ``lease`` is held."""
        if self.enabled:
            self._resources = (counts, lease)

    def shutdown(self) -> None:
        """Flush pending telemetry and release the cleanup-leader lease."""
        if self._resources and self._resources[1] is not None:
            try:
                self._resources[1].release()
            except Exception:  # noqa: BLE001 - best effort on the way out
                logger.debug("could not release the leader lease", exc_info=True)
        self._shutdown()

    # ------------------------------------------------------------------ observable callbacks
    def _observe_queues(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(depth(), attrs) for depth, attrs in self._queues]

    def _resource_callback(
        self, key: str, refresh: bool
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        # A collection calls the gauges in creation order: the first one renews the lease and
        # scans the store once, the other three reuse that snapshot.
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            if refresh:
                self._counts = self._read_counts()
            return [] if self._counts is None else [Observation(self._counts.get(key, 0))]

        return observe

    def _read_counts(self) -> dict[str, int] | None:
        if self._resources is None:
            return None
        source, lease = self._resources
        if lease is not None and not lease.renew():
            return None
        try:
            return source()
        except Exception:  # noqa: BLE001 - a failed read must not break the export
            logger.warning("cannot read server state counts", exc_info=True)
            return None


def _args(metric: spec.MetricSpec) -> dict[str, str]:
    return {"name": metric.name, "unit": metric.unit, "description": metric.description}


NOOP = Telemetry("none", metrics.NoOpMeterProvider(), trace.NoOpTracerProvider(), enabled=False)

_current: Telemetry | None = None
_lock = threading.Lock()


def current_telemetry() -> Telemetry:
    """The process's telemetry (the no-op one until :func:`setup_telemetry` enabled it)."""
    return _current or NOOP


def setup_telemetry(
    config: Any,
    component: str,
    *,
    metric_readers: Sequence[Any] | None = None,
    span_exporters: Sequence[Any] | None = None,
) -> Telemetry:
    """Build this process's telemetry pipeline from a ``TelemetryConfig``; idempotent.

    The resource is ``service.name`` plus ``resource_attributes`` plus ``twinkle.component``.
    Traces, metrics and logs (the ``twinkle`` logger) go to the OTLP gRPC ``otlp_endpoint``, or to
    the console when ``debug`` is true. Disabled: returns the no-op :data:`NOOP`.

    Args:
        config: A :class:`~twinkle.server.config.TelemetryConfig`.
        component: Gateway, Model, Sampler or Processor.
        metric_readers: Replace the exporters' metric readers (tests pass an in-memory reader);
            telemetry is then on whatever ``config.enabled`` says.
        span_exporters: Replace the span exporters likewise (exported synchronously).
    """
    global _current
    overridden = metric_readers is not None or span_exporters is not None
    with _lock:
        if _current is not None:
            return _current
        if not (config.enabled or overridden):
            return NOOP
        from twinkle.server.telemetry._exporters import build_providers

        meter_provider, tracer_provider, shutdown = build_providers(
            config, component, metric_readers=metric_readers, span_exporters=span_exporters
        )
        _current = Telemetry(
            component, meter_provider, tracer_provider, enabled=True, shutdown=shutdown
        )
    target = (
        "the given readers" if overridden else "console" if config.debug else config.otlp_endpoint
    )
    logger.info("Worker telemetry initialized (component=%s, exporting to %s)", component, target)
    return _current


def shutdown_telemetry() -> None:
    """Flush and close this process's pipeline; the next :func:`setup_telemetry` starts afresh."""
    global _current
    with _lock:
        telemetry, _current = _current, None
    if telemetry is not None:
        telemetry.shutdown()
