"""Mixed multi-tenant load at reduced size (bench/load_mixed.py): twinkle_client SFT, Tinker SDK
SFT and Tinker SDK RL tenants at once over real HTTP under low per-tenant rate limits. Every
tenant finishes exactly its steps; the only refusals are 429s (both clients retry them) and
``paused_rate_limit`` futures (the gateway retries a queue's refusal for the SDK).

The full size (16 tenants x 200 steps) and the soak are ``python bench/load_mixed.py`` and
``tools/run_soak.sh``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import httpx
import pytest

from twinkle.server.tinker.futures import TinkerFutures
from twinkle.server.web.errors import RateLimited
from twinkle.server.web.http import error_response
from twinkle_client._http import HttpTransport

BENCH = Path(__file__).resolve().parents[2] / "bench" / "load_mixed.py"
TENANTS, STEPS = 4, 10  # two twinkle_client SFT, one Tinker SFT, one Tinker RL
RPS_LIMIT = 0.5  # one training call per 2 s per tenant: binds even on a busy machine


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("load_mixed", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_429_says_its_exact_wait_and_a_header_that_is_never_early():
    response = error_response(RateLimited("over tps_limit", retry_after=1.4))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"  # 1 would send the retry 0.4 s too early
    assert response.headers["retry-after-ms"] == "1400"  # what the Tinker SDK waits
    assert b'"retry_after":1.4' in response.body


def test_the_client_first_waits_exactly_the_servers_retry_after_then_backs_off():
    def refused(wait: float) -> httpx.Response:
        body = {"error": "over tps_limit", "category": "user", "retry_after": wait}
        return httpx.Response(429, json=body, headers={"Retry-After": "1"})

    replies = [refused(0.2), httpx.Response(200, json={"ok": 1})]
    sleeps: list[float] = []
    http = HttpTransport(
        "http://test",
        "key",
        transport=httpx.MockTransport(lambda request: replies.pop(0)),
        sleep=sleeps.append,
    )
    assert http.post("/x", {}) == {"ok": 1}
    assert sleeps == [0.2]  # not the header's whole second, not the 0.5 s backoff floor
    replies[:] = [refused(0.2), refused(0.2), refused(0.2), httpx.Response(200, json={"ok": 2})]
    sleeps.clear()
    assert http.post("/x", {}) == {"ok": 2}
    assert sleeps == [0.2, 1.0, 2.0]  # refused again: another caller took the room, back off


def test_idle_tinker_lanes_are_bounded_and_busy_ones_kept():
    """Every Tinker training client gets an ordering lane; the soak creates them without end.
    Idle ones beyond the bound are forgotten, oldest first; one with a call running or waiting
    for its turn never is."""

    async def scenario() -> list[str]:
        futures = TinkerFutures(state=None, max_idle_lanes=3)
        _, running = await futures.lane("running").admit(1)  # its call has not finished
        futures.lane("waiting").admitting += 1  # submitted, not let in yet
        for i in range(1000):
            _, done = await futures.lane(f"client-{i}").admit(1)
            done.set_result(None)
        running.set_result(None)
        return list(futures._lanes)

    assert asyncio.run(scenario()) == ["running", "waiting", "client-999"]


@pytest.mark.integration
def test_mixed_tenants_finish_exactly_their_steps_under_rate_limits(bench):
    records = bench.run_load(TENANTS, STEPS, {"rps_limit": RPS_LIMIT}, sync=5)
    summary = records[-1]
    tenants = [r for r in records if r["record"] == "tenant"]
    assert summary["client_errors"] == []
    assert summary["unexpected_statuses"] == {}
    assert [t["steps"] for t in tenants] == [STEPS] * TENANTS and summary["exact_steps"]
    assert [t["kind"] for t in tenants] == ["twinkle_sft", "tinker_sft", "tinker_rl", "twinkle_sft"]
    for tenant in tenants:
        refused = tenant["refused_model"] + tenant["refused_sampler"]
        assert refused > 0, tenant  # the limit binds for every kind of client
        if tenant["kind"] == "twinkle_sft":
            assert tenant["paused_rate_limit"] == 0
        else:  # every refusal of a Tinker call paused its future and was retried
            assert tenant["paused_rate_limit"] == refused, tenant
    twinkle_refusals = sum(t["refused_model"] for t in tenants if t["kind"] == "twinkle_sft")
    # Each refusal of a twinkle_client call reached it as an HTTP 429, which it retried.
    assert summary["http_429"] == twinkle_refusals
    assert summary["model_rate_limit_rejections"] == sum(t["refused_model"] for t in tenants)
    for tenant in tenants:  # nobody beats the limit (the first call is the bucket's burst)
        assert tenant["steps_per_s"] <= RPS_LIMIT * STEPS / (STEPS - 1) * 1.05, tenant
    ops = {(r["kind"], r["op"]): r for r in records if r["record"] == "op"}
    assert ops[("twinkle_sft", "step")]["n"] == 2 * STEPS
    assert ops[("tinker_rl", "sample")]["n"] == STEPS
    assert ops[("tinker_rl", "save_weights_and_get_sampling_client")]["n"] == STEPS // 5
    assert summary["fairness_by_kind"]["twinkle_sft"] < 1.5


@pytest.mark.integration
def test_a_per_key_limit_on_every_route_is_retried_by_both_clients(bench):
    """``rps_limit_per_key`` answers 429 on any route, the Tinker SDK's own calls included
    (futures, polls, heartbeats): both clients wait and retry, and nothing else fails."""
    records = bench.run_load(2, 5, {"rps_limit_per_key": 2.0})
    summary = records[-1]
    assert summary["client_errors"] == [] and summary["unexpected_statuses"] == {}
    assert [r["steps"] for r in records if r["record"] == "tenant"] == [5, 5]
    refused = summary["http_429_by_route"]
    assert sum(n for route, n in refused.items() if route.startswith("model/")) > 0  # twinkle
    tinker_routes = ("forward_backward", "optim_step", "retrieve_future", "retrieve_futures")
    assert sum(refused.get(route, 0) for route in tinker_routes) > 0  # the SDK's calls
