"""Only the cleanup leader publishes the resource gauges; an expired lease hands over."""

import logging

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from twinkle.server.state import MemoryStore
from twinkle.server.telemetry import LEADER_KEY, LeaderLease, Telemetry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _worker(store, name, clock, counts):
    reader = InMemoryMetricReader()
    telemetry = Telemetry(
        "Gateway", MeterProvider(metric_readers=[reader]), TracerProvider(), enabled=True
    )
    lease = LeaderLease(store, ttl_s=30, holder=name, clock=clock)
    telemetry.publish_resources(lambda: counts, lease)
    return reader, lease


def _published(reader) -> dict:
    found, data = {}, reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for scope in rm.scope_metrics:
            for metric in scope.metrics:
                if metric.name.endswith(".active") and metric.data.data_points:
                    found[metric.name] = metric.data.data_points[0].value
    return found


def test_one_worker_publishes_and_expiry_hands_over(caplog):
    caplog.set_level(logging.INFO, logger="twinkle")
    store, clock = MemoryStore("t:"), Clock()
    counts = {"active_sessions": 3, "models": 2, "sampling_sessions": 1, "futures": 4}
    reader_a, lease_a = _worker(store, "worker-a", clock, counts)
    reader_b, lease_b = _worker(store, "worker-b", clock, counts)

    assert _published(reader_a) == {
        "twinkle.sessions.active": 3,
        "twinkle.models.active": 2,
        "twinkle.sampling_sessions.active": 1,
        "twinkle.futures.active": 4,
    }
    assert _published(reader_b) == {}
    assert store.get(LEADER_KEY)["holder"] == "worker-a"
    assert "became cleanup leader (worker worker-a)" in caplog.text

    clock.now += 20  # a renews within its lease: b still waits
    assert _published(reader_a) and not _published(reader_b)

    clock.now += 31  # a stopped renewing (died): its lease expired, b takes over
    assert _published(reader_b)["twinkle.sessions.active"] == 3
    assert store.get(LEADER_KEY)["holder"] == "worker-b"
    assert "became cleanup leader (worker worker-b)" in caplog.text
    assert _published(reader_a) == {} and not lease_a.held and lease_b.held


def test_release_lets_the_next_worker_lead_at_once():
    store, clock = MemoryStore(), Clock()
    a = LeaderLease(store, ttl_s=30, holder="a", clock=clock)
    b = LeaderLease(store, ttl_s=30, holder="b", clock=clock)
    assert a.renew() and not b.renew()
    a.release()
    assert b.renew() and not a.renew()
