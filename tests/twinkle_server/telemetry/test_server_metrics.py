"""Every metric of a running in-process server: names, kinds, attributes and values."""

import asyncio
import threading
import time

from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum
from otel_capture import points

from twinkle.server.telemetry import tenant_hash
from twinkle.server.testing import client, local_server

MODEL = "/api/v1/model/tiny/qwen3"
ROWS = [
    {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, 6, 7, 8, 9]},
    {"input_ids": [3, 4, 5], "labels": [3, 4, 5]},
]


async def _train(http, name="default", steps=2):
    r = await http.post(
        f"{MODEL}/add_adapter_to_model", json={"adapter_name": name, "config": {"r": 4}}
    )
    assert r.status_code == 200, r.text
    await http.post(
        f"{MODEL}/set_optimizer", json={"adapter_name": name, "optimizer": "Adam", "lr": 1e-2}
    )
    losses = []
    for _ in range(steps):
        r = await http.post(
            f"{MODEL}/forward_backward", json={"adapter_name": name, "inputs": ROWS}
        )
        losses.append(r.json()["result"]["loss"])
        assert (
            await http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": name})
        ).status_code == 200
    return losses


def test_http_metrics_per_component_route_method_status(tmp_path, captured):
    server = local_server(tmp_path, backend="mock")

    async def scenario():
        async with client(server) as alice, client(server, who=None) as anon:
            await _train(alice, steps=1)
            assert (await alice.get("/api/v1/get_server_capabilities")).status_code == 200
            assert (await anon.get("/api/v1/training_runs")).status_code == 401

    asyncio.run(scenario())
    metrics = captured.metrics()
    requests = metrics["twinkle.http.requests.total"]
    assert isinstance(requests.data, Sum) and requests.data.is_monotonic
    [ops] = points(requests, component="Model", route="/{op}", method="POST", status=200)
    assert ops.value == 4  # add adapter, set optimizer, forward_backward, step
    assert (
        points(
            requests,
            component="Gateway",
            route="/get_server_capabilities",
            method="GET",
            status=200,
        )[0].value
        == 1
    )
    assert points(requests, component="Gateway", route="/training_runs", status=401)[0].value == 1
    duration = metrics["twinkle.http.request.duration_seconds"]
    assert isinstance(duration.data, Histogram)
    [hist] = points(duration, component="Model", route="/{op}", status=200)
    assert hist.count == 4 and 0 < hist.sum < 30
    assert hist.explicit_bounds[0] == 0.005  # seconds buckets, not the SDK's millisecond ones


def test_task_and_training_metrics(tmp_path, captured):
    server = local_server(tmp_path, backend="mock")

    async def scenario():
        async with client(server) as alice:
            losses = await _train(alice, steps=3)
            r = await alice.post(
                f"{MODEL}/forward_backward",
                json={"adapter_name": "default", "inputs": [{"bad": 1}]},
            )
            assert r.status_code == 400
            return losses

    losses = asyncio.run(scenario())
    metrics = captured.wait_for_tasks(2 + 3 * 2 + 1)
    tasks = metrics["twinkle.tasks.total"]
    assert isinstance(tasks.data, Sum)
    assert points(tasks, component="Model", op="forward_backward", outcome="ok")[0].value == 3
    assert points(tasks, component="Model", op="forward_backward", outcome="error")[0].value == 1
    assert points(tasks, op="clip_grad_and_step", outcome="ok")[0].value == 3
    for name in ("twinkle.task.execution_seconds", "twinkle.task.wait_seconds"):
        assert isinstance(metrics[name].data, Histogram)
        [fb] = points(metrics[name], component="Model", model="tiny/qwen3", op="forward_backward")
        assert fb.count == 4 and fb.sum >= 0

    entry = next(iter(server.services["model"].adapters.values()))
    tenant = {"model": "tiny/qwen3", "tenant": tenant_hash(entry.owner)}
    assert entry.owner not in tenant["tenant"] and "key-alice" not in str(tenant)
    assert points(metrics["twinkle.train.steps.total"], **tenant)[0].value == 3
    assert points(metrics["twinkle.train.tokens.total"], **tenant)[0].value == 3 * 8
    loss = metrics["twinkle.train.loss"]
    assert isinstance(loss.data, Gauge)
    assert points(loss, **tenant)[0].value == losses[-1]


def test_training_series_are_per_tenant_so_adapter_churn_adds_none(tmp_path, captured):
    """Adapters created and removed, again and again: the training series stay one per tenant
    (their figures summed over its adapters), none per adapter, and the recorder keeps nothing
    of the removed adapters (the SDK would hide every series after its 2000th as overflow)."""
    server = local_server(tmp_path, backend="mock")
    cycles = 20  # more than the 16 stale records the recorder tolerates before it prunes

    async def scenario():
        async with client(server) as alice:
            for i in range(cycles):
                await _train(alice, name=f"a{i}", steps=1)
                r = await alice.post(f"{MODEL}/remove_adapter", json={"adapter_name": f"a{i}"})
                assert r.status_code == 200, r.text

    asyncio.run(scenario())
    metrics = captured.wait_for_tasks(cycles * 3)
    steps = metrics["twinkle.train.steps.total"].data.data_points
    tokens = metrics["twinkle.train.tokens.total"].data.data_points
    assert len(steps) == len(tokens) == 1
    assert set(steps[0].attributes) == {"model", "tenant"}
    assert steps[0].value == cycles and tokens[0].value == cycles * 8
    recorder = server.services["model"].scheduler._on_done.__self__  # ModelTaskMetrics
    assert len(recorder._seen) <= 17  # without pruning: one record per adapter ever trained


def test_rate_limit_rejections_count_429s(tmp_path, captured):
    server = local_server(tmp_path, backend="mock", queue_config={"rps_limit": 1})

    async def scenario():
        async with client(server) as alice:
            await alice.post(
                f"{MODEL}/add_adapter_to_model", json={"adapter_name": "a", "config": {"r": 4}}
            )
            statuses = [
                (
                    await alice.post(f"{MODEL}/forward", json={"adapter_name": "a", "inputs": ROWS})
                ).status_code
                for _ in range(3)
            ]
            return statuses

    statuses = asyncio.run(scenario())
    assert statuses.count(429) >= 2
    rejections = captured.metrics()["twinkle.rate_limit.rejections.total"]
    assert isinstance(rejections.data, Sum) and rejections.data.is_monotonic
    assert points(rejections, component="Model", route="/{op}")[0].value == statuses.count(429)


def test_queue_depth_follows_the_scheduler(tmp_path, captured):
    server = local_server(tmp_path, backend="mock")
    service = server.services["model"]
    release = threading.Event()
    original = service.model.set_optimizer

    def blocking_set_optimizer(*args, **kwargs):
        release.wait(10)
        return original(*args, **kwargs)

    service.model.set_optimizer = blocking_set_optimizer

    async def scenario():
        async with client(server) as alice:
            await alice.post(
                f"{MODEL}/add_adapter_to_model", json={"adapter_name": "a", "config": {"r": 4}}
            )
            body = {"adapter_name": "a", "optimizer": "Adam", "lr": 1e-3}
            calls = [
                asyncio.create_task(alice.post(f"{MODEL}/set_optimizer", json=body))
                for _ in range(3)
            ]
            deadline = time.monotonic() + 10
            while service.scheduler.depth() != 2:  # one running (blocked), two queued
                assert time.monotonic() < deadline, "calls never queued"
                await asyncio.sleep(0.01)
            depth = points(
                captured.metrics()["twinkle.queue.depth"], component="Model", model="tiny/qwen3"
            )
            release.set()
            await asyncio.gather(*calls)
            return depth

    [depth] = asyncio.run(scenario())
    assert depth.value == 2
    assert points(captured.metrics()["twinkle.queue.depth"], model="tiny/qwen3")[0].value == 0


def test_resource_gauges_are_published_by_the_local_leader(tmp_path, captured):
    server = local_server(tmp_path, backend="mock")

    async def scenario():
        async with client(server) as alice:
            r = await alice.post("/api/v1/create_session", json={"tags": []})
            assert r.status_code == 200, r.text
            await alice.post(
                f"{MODEL}/add_adapter_to_model", json={"adapter_name": "a", "config": {"r": 4}}
            )

    asyncio.run(scenario())
    counts = server.context.state.counts()
    metrics = captured.metrics()
    for key, name in {
        "active_sessions": "twinkle.sessions.active",
        "models": "twinkle.models.active",
        "sampling_sessions": "twinkle.sampling_sessions.active",
        "futures": "twinkle.futures.active",
    }.items():
        assert isinstance(metrics[name].data, Gauge)
        assert metrics[name].data.data_points[0].value == counts[key]
    assert counts["active_sessions"] >= 1 and counts["models"] == 1


def test_disabled_telemetry_records_nothing(tmp_path):
    from twinkle.server.telemetry import NOOP, current_telemetry, shutdown_telemetry

    shutdown_telemetry()
    server = local_server(tmp_path, backend="mock")

    async def scenario():
        async with client(server) as alice:
            assert (await alice.get("/api/v1/get_server_capabilities")).status_code == 200

    asyncio.run(scenario())
    assert current_telemetry() is NOOP
