"""In-memory capture of one test's telemetry: metrics by name, finished spans, data points."""

from __future__ import annotations

import time

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class Captured:
    """What one test's pipeline recorded."""

    def __init__(
        self, telemetry, reader: InMemoryMetricReader, spans: InMemorySpanExporter
    ) -> None:
        self.telemetry, self.reader, self.spans = telemetry, reader, spans

    def metrics(self) -> dict:
        """``name -> Metric`` of one collection (data points with attributes and values)."""
        data = self.reader.get_metrics_data()
        found = {}
        for resource_metrics in data.resource_metrics if data else ():
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    found[metric.name] = metric
        return found

    def wait_for_tasks(self, count: int, timeout_s: float = 10.0) -> dict:
        """Metrics once ``count`` tasks are recorded (``on_task_done`` runs on the worker thread,
        just after the caller got its reply)."""
        deadline = time.monotonic() + timeout_s
        while True:
            metrics = self.metrics()
            tasks = metrics.get("twinkle.tasks.total")
            if tasks is not None and sum(p.value for p in tasks.data.data_points) >= count:
                return metrics
            assert time.monotonic() < deadline, f"{count} tasks were never recorded"
            time.sleep(0.01)

    def finished_spans(self, name: str | None = None) -> list:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]


def points(metric, **attributes) -> list:
    """Data points of ``metric`` whose attributes include ``attributes``."""
    return [
        p
        for p in metric.data.data_points
        if all(p.attributes.get(k) == v for k, v in attributes.items())
    ]
