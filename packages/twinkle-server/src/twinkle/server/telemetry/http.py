"""HTTP telemetry for every deployment's app: one span and the request metrics per request.

Pure ASGI middleware (no body buffering): the span continues the client's W3C ``traceparent``;
``twinkle.session_id`` comes from the ``X-Twinkle-Session-Id`` header or the body's
``session_id``, sniffed from the first bytes the app reads.
"""

from __future__ import annotations

import re
import time
from typing import Any

from opentelemetry import propagate, trace

from twinkle.server.telemetry._pipeline import current_telemetry
from twinkle.server.telemetry.tracing import SESSION_ATTRIBUTE, span_name

SESSION_HEADERS = ("x-twinkle-session-id", "x-session-id")
_SESSION_IN_BODY = re.compile(rb'"session_id"\s*:\s*"([A-Za-z0-9_.:-]{1,128})"')
_SNIFF_BYTES = 64 * 1024
_COMPONENT_BY_SEGMENT = {"model": "Model", "sampler": "Sampler", "processor": "Processor"}


def component_for_path(path: str) -> str:
    """``/api/v1/model/org/name/...`` -> ``Model``; sampler, processor likewise; else ``Gateway``."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api" and parts[2] in _COMPONENT_BY_SEGMENT:
        return _COMPONENT_BY_SEGMENT[parts[2]]
    return "Gateway"


class HttpTelemetryMiddleware:
    """ASGI middleware recording ``twinkle.http.*`` metrics and a ``twinkle.server.<component>`` span.

    Args:
        app: The wrapped ASGI app.
        component: Fixed component name; ``None`` derives it from the request path.
    """

    def __init__(self, app: Any, component: str | None = None) -> None:
        self.app, self.component = app, component

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        telemetry = current_telemetry()
        if scope["type"] != "http" or not telemetry.enabled:
            await self.app(scope, receive, send)
            return
        path, root = scope.get("path", ""), scope.get("root_path", "")
        full_path = path if path.startswith(root) else root + path
        component = self.component or component_for_path(full_path)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
        method = scope.get("method", "GET")
        status = 500
        started = time.perf_counter()
        with telemetry.tracer.start_as_current_span(
            span_name(component),
            context=propagate.extract(headers),
            kind=trace.SpanKind.SERVER,
            attributes={
                "twinkle.component": component,
                "http.request.method": method,
                "url.path": full_path,
            },
        ) as span:
            session = next((headers[h] for h in SESSION_HEADERS if headers.get(h)), None)
            if session:
                span.set_attribute(SESSION_ATTRIBUTE, session)
            sniffed = bytearray()

            async def receive_sniffing() -> dict:
                nonlocal session
                message = await receive()
                if (
                    not session
                    and message.get("type") == "http.request"
                    and len(sniffed) < _SNIFF_BYTES
                ):
                    sniffed.extend(message.get("body", b"")[: _SNIFF_BYTES - len(sniffed)])
                    if match := _SESSION_IN_BODY.search(sniffed):
                        session = match.group(1).decode()
                        span.set_attribute(SESSION_ATTRIBUTE, session)
                return message

            async def send_with_status(message: dict) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await self.app(scope, receive_sniffing, send_with_status)
            finally:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                span.set_attribute("http.route", route)
                if isinstance(op := scope.get("path_params", {}).get("op"), str):
                    span.set_attribute("twinkle.op", op)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(trace.StatusCode.ERROR)
                telemetry.record_http(
                    component, route, method, status, time.perf_counter() - started
                )


def install_http_telemetry(app: Any, component: str | None = None) -> None:
    """Add :class:`HttpTelemetryMiddleware` to a FastAPI/Starlette ``app``."""
    app.add_middleware(HttpTelemetryMiddleware, component=component)
