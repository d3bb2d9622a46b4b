"""Integration: a real OTLP gRPC receiver on 127.0.0.1 gets spans, metrics and logs from a live server."""

import logging
import threading
import time
from concurrent import futures

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from twinkle.server.config import TelemetryConfig
from twinkle.server.process import cli
from twinkle.server.telemetry import setup_telemetry, shutdown_telemetry
from twinkle.server.testing import KEYS, local_server, serve_in_thread

pytestmark = pytest.mark.integration
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
MODEL = "/api/v1/model/tiny/qwen3"


class Receiver(
    trace_service_pb2_grpc.TraceServiceServicer,
    metrics_service_pb2_grpc.MetricsServiceServicer,
    logs_service_pb2_grpc.LogsServiceServicer,
):
    """A minimal OTLP collector: keeps every export request."""

    def __init__(self) -> None:
        self.spans, self.metrics, self.logs = [], [], []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 - the gRPC method name
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.spans += [
                    s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans
                ]
                return trace_service_pb2.ExportTraceServiceResponse()
            if isinstance(request, metrics_service_pb2.ExportMetricsServiceRequest):
                self.metrics += [
                    (rm.resource, m)
                    for rm in request.resource_metrics
                    for sm in rm.scope_metrics
                    for m in sm.metrics
                ]
                return metrics_service_pb2.ExportMetricsServiceResponse()
            self.logs += [
                r for rl in request.resource_logs for sl in rl.scope_logs for r in sl.log_records
            ]
            return logs_service_pb2.ExportLogsServiceResponse()

    def metric_names(self) -> set[str]:
        with self.lock:
            return {m.name for _, m in self.metrics}


@pytest.fixture
def receiver():
    collector = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(collector, server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield collector, f"http://127.0.0.1:{port}"
    server.stop(grace=None)


def test_live_server_exports_to_a_real_otlp_receiver(tmp_path, receiver, caplog, capsys):
    collector, endpoint = receiver
    caplog.set_level(logging.INFO, logger="twinkle")
    shutdown_telemetry()
    config = TelemetryConfig(
        enabled=True,
        otlp_endpoint=endpoint,
        export_interval_ms=200,
        service_name="twinkle-it",
        resource_attributes={"deployment.environment": "test"},
    )
    setup_telemetry(config, "Gateway")
    try:
        server = local_server(tmp_path, backend="mock")
        with serve_in_thread(server.app) as url:
            headers = {"Authorization": f"Bearer {KEYS['alice']}"}
            with httpx.Client(base_url=url, headers=headers) as http:
                r = http.post(
                    f"{MODEL}/add_adapter_to_model",
                    json={"adapter_name": "a", "config": {"r": 4}},
                    headers={"traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-01"},
                )
                assert r.status_code == 200, r.text
                r = http.post(
                    f"{MODEL}/forward_backward",
                    json={
                        "adapter_name": "a",
                        "inputs": [{"input_ids": [4, 5, 6, 7], "labels": [4, 5, 6, 7]}],
                    },
                )
                assert r.status_code == 200, r.text
            # The status command end to end, as an operator runs it.
            assert cli.main(["status", "--url", url, "--api-key", KEYS["alice"], "--once"]) == 0
            assert "tiny/qwen3" in capsys.readouterr().out
            wanted = {
                "twinkle.http.requests.total",
                "twinkle.tasks.total",
                "twinkle.train.loss",
                "twinkle.sessions.active",
            }
            deadline = time.monotonic() + 15
            while not wanted <= collector.metric_names():  # periodic export, every 200 ms
                assert time.monotonic() < deadline, (
                    f"metrics never arrived: {collector.metric_names()}"
                )
                time.sleep(0.05)
    finally:
        shutdown_telemetry()  # flushes the batched spans and logs

    resource, _ = collector.metrics[0]
    attrs = {kv.key: kv.value.string_value for kv in resource.attributes}
    assert attrs["service.name"] == "twinkle-it" and attrs["deployment.environment"] == "test"
    assert attrs["twinkle.component"] == "Gateway"
    model_spans = [s for s in collector.spans if s.name == "twinkle.server.Model"]
    assert any(s.trace_id.hex() == TRACE_ID for s in model_spans)
    assert any(s.name == "twinkle.server.Gateway" for s in collector.spans)
    bodies = [r.body.string_value for r in collector.logs]
    assert any("Worker telemetry initialized" in b for b in bodies)
    assert any("became cleanup leader" in b for b in bodies)
