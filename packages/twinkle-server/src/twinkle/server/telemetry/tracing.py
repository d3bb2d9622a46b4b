"""Spans named ``twinkle.server.<component>`` and W3C trace context across deployments.

HTTP requests get their span from :mod:`.http`. Calls the gateway makes to a model or sampler
(Serve handle, or in-process) carry the caller's ``traceparent`` in the payload under
:data:`TRACE_KEY`; the receiving side takes it out before the service sees the payload.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import propagate, trace

from twinkle.server.telemetry._pipeline import current_telemetry

TRACE_KEY = "_trace"
SESSION_ATTRIBUTE = "twinkle.session_id"


def span_name(component: str) -> str:
    return f"twinkle.server.{component}"


def inject_trace(payload: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of ``payload`` carrying the current trace context (unchanged when there is none)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    payload = dict(payload or {})
    if carrier:
        payload[TRACE_KEY] = carrier
    return payload


async def serve_traced(
    component: str,
    call: Callable[..., Awaitable[Any]],
    owner: str,
    op: str,
    payload: dict[str, Any] | None,
) -> Any:
    """Run ``call(owner, op, payload)`` in a ``twinkle.server.<component>`` span continuing the
    caller's trace from ``payload[TRACE_KEY]`` (always removed from the payload)."""
    payload = dict(payload or {})
    carrier = payload.pop(TRACE_KEY, None)
    telemetry = current_telemetry()
    if not telemetry.enabled:
        return await call(owner, op, payload)
    parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
    attributes = {"twinkle.component": component, "twinkle.op": op}
    if isinstance(payload.get("session_id"), str):
        attributes[SESSION_ATTRIBUTE] = payload["session_id"]
    with telemetry.tracer.start_as_current_span(
        span_name(component), context=parent, kind=trace.SpanKind.SERVER, attributes=attributes
    ):
        return await call(owner, op, payload)


class TracedClient:
    """Wraps the gateway's client of a model or sampler so every call carries the trace context."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def call(self, owner: str, op: str, payload: dict[str, Any]) -> Any:
        return await self.inner.call(owner, op, inject_trace(payload))

    def __getattr__(self, name: str) -> Any:  # unload_session and friends pass straight through
        return getattr(self.inner, name)


class TracedService:
    """The receiving side for an in-process service: ``call`` continues the caller's trace."""

    def __init__(self, service: Any, component: str) -> None:
        self.service, self.component = service, component

    async def call(self, owner: str, op: str, payload: dict[str, Any] | None = None) -> Any:
        return await serve_traced(self.component, self.service.call, owner, op, payload)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.service, name)
