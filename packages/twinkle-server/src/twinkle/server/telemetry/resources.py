"""The server-wide resource gauges (sessions, models, sampling sessions, futures)."""

from __future__ import annotations

from typing import Any

from twinkle.server.telemetry._pipeline import Telemetry, current_telemetry
from twinkle.server.telemetry.leader import LeaderLease


def lease_ttl_s(export_interval_ms: int) -> float:
    """Three export intervals (at least 10 s): the leader renews at every export."""
    return max(10.0, 3 * export_interval_ms / 1000)


def publish_resource_gauges(ctx: Any, telemetry: Telemetry | None = None) -> LeaderLease | None:
    """Publish ``ctx.state.counts()`` from this worker while it is the cleanup leader.

    Every gateway replica calls this; the lease in ``ctx.state.store`` makes exactly one of them
    publish. Returns the lease (``None`` when telemetry is off).
    """
    telemetry = telemetry or current_telemetry()
    if not telemetry.enabled:
        return None
    lease = LeaderLease(ctx.state.store, ttl_s=lease_ttl_s(ctx.config.telemetry.export_interval_ms))
    telemetry.publish_resources(ctx.state.counts, lease)
    return lease
