"""Spans: one ``twinkle.server.<component>`` per request, trace context from client to model."""

import asyncio

from fastapi import Request
from opentelemetry.trace import SpanKind

from twinkle.server.telemetry import TRACE_KEY, inject_trace
from twinkle.server.testing import client, local_server

MODEL = "/api/v1/model/tiny/qwen3"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def _relay_route(server):
    """A gateway route that calls the model deployment, as the Tinker routes do."""
    gateway = next(route.app for route in server.app.routes if route.path == "/api/v1")

    @gateway.post("/test_relay")
    async def relay(request: Request) -> dict:
        owner = server.context.authenticate(request.headers)
        model = server.backends.model("tiny/qwen3")
        return await model.call(
            owner, "get_train_configs", {"adapter_name": "a", "session_id": "sess-relay"}
        )


def test_client_traceparent_gateway_and_model_spans_share_the_trace(tmp_path, captured):
    server = local_server(tmp_path, backend="mock")
    _relay_route(server)

    async def scenario():
        async with client(server) as alice:
            await alice.post(
                f"{MODEL}/add_adapter_to_model", json={"adapter_name": "a", "config": {"r": 4}}
            )
            r = await alice.post("/api/v1/test_relay", headers={"traceparent": TRACEPARENT})
            assert r.status_code == 200, r.text
            assert r.json()["adapter_name"] == "a"

    asyncio.run(scenario())
    [gateway] = captured.finished_spans("twinkle.server.Gateway")
    models = captured.finished_spans("twinkle.server.Model")
    [relayed] = [s for s in models if s.attributes.get("twinkle.op") == "get_train_configs"]
    assert format(gateway.context.trace_id, "032x") == TRACE_ID
    assert format(gateway.parent.span_id, "016x") == PARENT_ID and gateway.kind == SpanKind.SERVER
    # The model span continues the gateway's trace through the payload's ``_trace`` carrier and
    # runs inside the gateway span (FastAPI's own operation span may sit in between once a
    # global tracer provider is set).
    assert relayed.context.trace_id == gateway.context.trace_id and relayed.parent.is_remote
    assert gateway.start_time <= relayed.start_time <= relayed.end_time <= gateway.end_time
    assert relayed.attributes["twinkle.session_id"] == "sess-relay"
    assert gateway.attributes["http.route"] == "/test_relay"
    assert gateway.attributes["http.response.status_code"] == 200


def test_model_http_span_has_session_id_from_body_or_header(tmp_path, captured):
    server = local_server(tmp_path, backend="mock")

    async def scenario():
        async with client(server) as alice:
            await alice.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "a", "config": {"r": 4}, "session_id": "sess-body"},
            )
            await alice.post(
                f"{MODEL}/get_train_configs",
                json={"adapter_name": "a"},
                headers={"X-Twinkle-Session-Id": "sess-header", "traceparent": TRACEPARENT},
            )
            await alice.get(f"{MODEL}/missing/route")

    asyncio.run(scenario())
    spans = {
        s.attributes.get("twinkle.op"): s for s in captured.finished_spans("twinkle.server.Model")
    }
    assert spans["add_adapter_to_model"].attributes["twinkle.session_id"] == "sess-body"
    assert spans["add_adapter_to_model"].parent is None  # no traceparent: a new trace
    configs = spans["get_train_configs"]
    assert configs.attributes["twinkle.session_id"] == "sess-header"
    assert format(configs.context.trace_id, "032x") == TRACE_ID
    assert configs.attributes["twinkle.component"] == "Model"
    assert configs.attributes["url.path"] == f"{MODEL}/get_train_configs"


def test_inject_trace_only_inside_a_span(captured):
    assert TRACE_KEY not in inject_trace({"a": 1})
    with captured.telemetry.tracer.start_as_current_span("x") as span:
        payload = inject_trace({"a": 1})
    assert payload["a"] == 1
    assert payload[TRACE_KEY]["traceparent"].split("-")[1] == format(
        span.get_span_context().trace_id, "032x"
    )
