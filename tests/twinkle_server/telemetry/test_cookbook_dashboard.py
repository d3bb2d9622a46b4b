"""The observability cookbook, checked without Docker: compose file, provisioning, dashboard queries."""

import json
import re
from pathlib import Path

import yaml

from twinkle.server.config import load_config
from twinkle.server.telemetry import METRICS

ROOT = Path(__file__).resolve().parents[3] / "cookbook" / "observability"
DASHBOARD = ROOT / "grafana" / "dashboards" / "twinkle-server-overview.json"
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def _known_series() -> set[str]:
    names = set()
    for metric in METRICS:
        base = metric.prometheus_name
        names |= {base + s for s in HISTOGRAM_SERIES} if metric.kind == "histogram" else {base}
    return names


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_compose_runs_otel_lgtm_with_the_documented_ports_and_dashboards():
    compose = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
    lgtm = compose["services"]["lgtm"]
    assert lgtm["image"].startswith("grafana/otel-lgtm")
    assert {p.split(":")[0] for p in lgtm["ports"]} == {"3000", "4317", "4318"}
    mounts = {v.split(":")[0]: v.split(":")[1] for v in lgtm["volumes"]}
    assert mounts["./grafana/provisioning/dashboards/twinkle.yaml"].startswith(
        "/otel-lgtm/grafana/conf/provisioning/dashboards/"
    )
    provider = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/twinkle.yaml").read_text())[
        "providers"
    ][0]
    assert (
        provider["type"] == "file" and mounts["./grafana/dashboards"] == provider["options"]["path"]
    )
    for host_path in mounts:
        if host_path.startswith("./"):
            assert (ROOT / host_path).exists(), host_path


def test_dashboard_has_the_overview_panels():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "Twinkle Server Overview" and dashboard["uid"]
    titles = {p["title"] for p in dashboard["panels"] if p["type"] != "row"}
    assert {
        "Request rate by component",
        "P95 latency by component",
        "Active resources",
        "Task queue depth",
        "Task execution P95 by operation",
        "Task wait P95 by operation",
        "Rate-limit rejections",
        "Task outcomes",
        "Loss per tenant",
    } <= titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        assert panel["type"] == "row" or panel["datasource"]["uid"] == "prometheus"


def test_every_queried_series_is_one_we_export():
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name for expr in _exprs(dashboard) for name in re.findall(r"\btwinkle_[a-z_]+", expr)
    }
    assert queried and queried <= _known_series(), queried - _known_series()
    exported = {m.prometheus_name for m in METRICS}
    bases = {
        next((q.removesuffix(s) for s in HISTOGRAM_SERIES if q.endswith(s)), q) for q in queried
    }
    assert exported <= bases  # every metric has a panel


def test_active_gauges_and_loss_are_never_rated():
    for expr in _exprs(json.loads(DASHBOARD.read_text())):
        for gauge in re.findall(r"(?:rate|increase)\((twinkle_[a-z_]+)", expr):
            assert not gauge.endswith("_active") and gauge not in (
                "twinkle_train_loss",
                "twinkle_queue_depth",
            )
    assert all(
        re.search(r"\[\$__rate_interval\]", e)
        for e in _exprs(json.loads(DASHBOARD.read_text()))
        if "rate(" in e or "increase(" in e
    )


def test_demo_server_config_enables_telemetry():
    config = load_config(str(ROOT / "server_config.yaml"))
    assert config.telemetry.enabled and config.telemetry.otlp_endpoint == "http://localhost:4317"
