"""Property-based fuzzing of every application's OpenAPI document with schemathesis.

Each application (gateway with the Tinker API, model, sampler, processor) publishes its request
bodies (``twinkle.server.web.openapi_bodies``); schemathesis generates positive and negative requests
from them, half of the id fields replaced by the tenant's real ids (a real model, session,
adapter, run or checkpoint) so that requests get past the lookups into the operations. They go
in-process over ``httpx.ASGITransport`` to a world of its own (the bad-input catalogue's server,
built again so that what the fuzzer creates never reaches the catalogue's tests). Oracles:

- no 5xx (schemathesis' ``not_a_server_error``), and an answer within the request timeout;
- a 4xx has a JSON body whose message names a field of the request (or the reason, for a
  record that is not found or a refused key) and leaks no traceback or Ray detail;
- a rejected request changes nothing: the catalogue's snapshot (store, storage files, adapter
  weights/grads/optimizer, datasets) before and after, once the server is idle.

Budget: ``TWINKLE_FUZZ_EXAMPLES`` examples per operation and generation mode in the default run
(default 2); ``TWINKLE_FUZZ_EXAMPLES_SLOW`` (default 25) in the slow test, which
``tools/run_fuzz.sh [N]`` runs.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("schemathesis")

import schemathesis  # noqa: E402
from _bad_input_cases import (  # noqa: E402
    BASE,
    MODEL,
    PROCESSOR,
    REQUEST_TIMEOUT_S,
    SAMPLER,
    client,
    diff,
    judge_body,
    snapshot,
    world,
)
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.core.failures import FailureGroup  # noqa: E402

GATEWAY = "/api/v1"
APPS = {"gateway": GATEWAY, "model": MODEL, "sampler": SAMPLER, "processor": PROCESSOR}
# Routes that would end the fuzzer's own fixtures (its key, session, model, adapter, checkpoint),
# reach the network (hub uploads), or take protobuf (the hand catalogue covers those).
EXCLUDED = {
    ("gateway", "DELETE", "/auth/apikey/me"),
    ("gateway", "POST", "/sessions/{session_id}/finish"),
    ("gateway", "POST", "/unload_model"),
    ("gateway", "DELETE", "/training_runs/{run_id}/checkpoints/{kind}/{name}"),
    ("gateway", "POST", "/forward_backward"),
    ("gateway", "POST", "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish"),
    ("model", "POST", "/remove_adapter"),
    ("model", "POST", "/upload_to_hub"),
}
# Words of messages that name the thing refused rather than a field: a record (of another key)
# that is "not found", a checkpoint path, a download URL, an adapter without gradients.
REASONS = (
    "not found",
    "unknown",
    "api key",
    "authoriz",
    "body",
    "json",
    "object",
    "operation",
    "checkpoint",
    "path",
    "url",
    "adapter",
)


# POST routes that read no body.
BODYLESS = (
    "/client/dynamic_config",
    "/auth/token",
    "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish",
)


@dataclass
class Tally:
    operations: int = 0
    examples: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.by_status.items() if status >= 500)


class Loop:
    """One event loop on a thread of its own for the whole run: the Tinker futures a request
    submits keep running between requests, as they do in a server."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro: Any, timeout: float = REQUEST_TIMEOUT_S * 3) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def _busy() -> list[asyncio.Task]:
    """This loop's tasks other than the caller and the model schedulers' workers (which live
    as long as the loop; what they run is awaited by a request or a future's task)."""
    me = asyncio.current_task()
    return [
        t
        for t in asyncio.all_tasks()
        if t is not me and not t.done() and not t.get_coro().__qualname__.endswith("._loop")
    ]


async def _idle(deadline_s: float = REQUEST_TIMEOUT_S) -> None:
    """Wait until no request, Tinker future or queued model call runs on this loop."""
    end = time.monotonic() + deadline_s
    while busy := _busy():
        if time.monotonic() > end:
            raise AssertionError(f"the server never went idle: {[t.get_coro() for t in busy]}")
        await asyncio.sleep(0.01)


def _real_ids(ids: dict[str, str]) -> dict[str, str]:
    return {
        "model_id": ids["alice_model"],
        "session_id": ids["alice_session"],
        "sampling_session_id": ids["alice_sampler"],
        "run_id": ids["alice_run"],
        "training_run_id": ids["alice_run"],
        "adapter_name": "default",
        "base_model": BASE,
        "path": ids["alice_ckpt"],
        "tinker_path": ids["alice_ckpt"],
        "adapter_uri": ids["alice_ckpt"],
        "checkpoint_dir": ids["alice_ckpt"],
    }


def _substitute(case: Any, real: dict[str, str], data: st.DataObject) -> None:
    """Replace some id fields of ``case`` with real ones (drawn, so examples replay)."""
    for params in (case.path_parameters, case.query):
        for key in list(params or {}):
            if key in real and data.draw(st.booleans(), label=f"real {key}"):
                params[key] = real[key]
    if isinstance(case.body, dict):
        for key in list(case.body):
            if key in real and data.draw(st.booleans(), label=f"real {key}"):
                case.body[key] = real[key]


def _mentions(case: Any) -> tuple[str, ...]:
    """Names a 4xx message may give: the request's fields and the operation's documented ones
    (a missing field is named by its documented name), at any depth, and the reasons."""
    names: set[str] = set(case.path_parameters or {}) | set(case.query or {})
    spec = case.operation.definition.raw
    stack = [case.body, spec.get("parameters", []), spec.get("requestBody", {})]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            names.update(k for k in value if isinstance(k, str) and k.strip())
            names.update(v for k, v in value.items() if k == "name" and isinstance(v, str))
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    names.add(case.operation.path.strip("/").split("/")[-1])
    return (*sorted(names), *REASONS)


async def _send(w: Any, prefix: str, case: Any) -> tuple[Any, list[str]]:
    await _idle()
    before = snapshot(w)
    kwargs = case.as_transport_kwargs(base_url=f"http://test{prefix}")
    kwargs.pop("cookies", None)
    headers = {k: v for k, v in kwargs.pop("headers").items() if k.lower() != "connection"}
    async with client(w, "alice") as http:
        try:
            response = await asyncio.wait_for(
                http.request(headers={**http.headers, **headers}, **kwargs), REQUEST_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            return None, [f"no answer within {REQUEST_TIMEOUT_S} s"]
    problems = []
    if 400 <= response.status_code < 500:
        problems += judge_body(response, _mentions(case))
        await _idle()
        changed = diff(before, snapshot(w))
        if changed:
            problems.append(f"rejected but state changed: {changed[:5]}")
    return response, problems


def _fuzz_operation(
    w: Any, loop: Loop, app: str, operation: Any, budget: int, tally: Tally
) -> None:
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        try:
            _fuzz_mode(w, loop, app, operation, mode, budget, tally)
        except Unsatisfiable:  # nothing to make negative (no parameters, no body)
            assert mode is GenerationMode.NEGATIVE, operation.label


def _fuzz_mode(
    w: Any, loop: Loop, app: str, operation: Any, mode: Any, budget: int, tally: Tally
) -> None:
    prefix, real = APPS[app], _real_ids(w.ids)
    label = f"{app} {operation.method.upper()} {operation.path} [{mode.value}]"

    @settings(
        max_examples=budget,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case: Any, data: st.DataObject) -> None:
        _substitute(case, real, data)
        response, problems = loop.run(_send(w, prefix, case))
        tally.examples += 1
        if response is not None:
            status = response.status_code
            tally.by_status[status] = tally.by_status.get(status, 0) + 1
            try:
                case.validate_response(response, checks=[not_a_server_error])
            except FailureGroup as exc:  # record every failure and go on
                problems.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            detail = f"{status} {response.text[:200]!r}"
        else:
            detail = "timeout"
        if problems:
            body = repr(case.body)[:200]
            tally.failures.append(f"{label} body={body}: {problems} ({detail})")

    run()


def fuzz(budget: int) -> Tally:
    """Every application's operations, ``budget`` examples per operation and mode."""
    w = _fuzz_world()
    loop = Loop()
    tally = Tally()
    for app, prefix in APPS.items():
        mount = next(r for r in w.server.app.routes if r.path == prefix)
        schema = schemathesis.openapi.from_dict(mount.app.openapi())
        for result in schema.get_all_operations():
            operation = result.ok()
            if (app, operation.method.upper(), operation.path) in EXCLUDED:
                continue
            tally.operations += 1
            _fuzz_operation(w, loop, app, operation, budget, tally)
    return tally


_WORLD: list[Any] = []


def _fuzz_world() -> Any:
    """The catalogue's world, built again for the fuzzer alone."""
    if not _WORLD:
        _WORLD.append(world.__wrapped__())
    return _WORLD[0]


def _report(tally: Tally) -> str:
    head = (
        f"{tally.operations} operations, {tally.examples} examples, "
        f"{tally.server_errors} 5xx, statuses {dict(sorted(tally.by_status.items()))}; "
        f"{len(tally.failures)} failures"
    )
    return "\n".join([head, *tally.failures[:40]])


def _check(tally: Tally, budget: int) -> None:
    print(_report(tally))
    assert not tally.failures, _report(tally)
    # Every operation ran: a shrinking schema (lost request bodies) would show here.
    assert tally.operations >= 80, _report(tally)
    assert tally.examples >= tally.operations * 2, _report(tally)
    assert sum(n for s, n in tally.by_status.items() if s < 300) > 0, _report(tally)


def test_fuzz_every_schema_briefly():
    budget = int(os.environ.get("TWINKLE_FUZZ_EXAMPLES", "2"))
    _check(fuzz(budget), budget)


@pytest.mark.slow
def test_fuzz_every_schema_at_length():
    budget = int(os.environ.get("TWINKLE_FUZZ_EXAMPLES_SLOW", "25"))
    _check(fuzz(budget), budget)


def test_every_json_route_documents_its_request_body():
    w = _fuzz_world()
    for app, prefix in APPS.items():
        mount = next(r for r in w.server.app.routes if r.path == prefix)
        spec = mount.app.openapi()
        for path, ops in spec["paths"].items():
            for method, op in ops.items():
                if method in ("post", "put"):
                    assert "requestBody" in op or path in BODYLESS, (app, method, path)
        assert "/{op}" not in spec["paths"], app


def test_the_mock_backend_serves_forward(tmp_path):
    """``POST <model>/forward`` on ``backend: mock`` was a 500 (the mock had no ``forward``):
    its log-probs are forward_only's, and it leaves the adapter as it was."""

    from twinkle.server.testing import client as server_client
    from twinkle.server.testing import local_server

    server = local_server(tmp_path, backend="mock")
    url = MODEL
    rows = [{"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 4]}]

    async def go():
        async with server_client(server) as http:
            added = await http.post(f"{url}/add_adapter_to_model", json={"config": {"r": 4}})
            assert added.status_code == 200, added.text
            before = snapshot_mock(server)
            forward = await http.post(f"{url}/forward", json={"inputs": rows})
            assert snapshot_mock(server) == before
            only = await http.post(f"{url}/forward_only", json={"inputs": rows})
            return forward, only

    forward, only = asyncio.run(go())
    assert forward.status_code == 200, forward.text
    result = forward.json()["result"]
    assert result["num_tokens"] == 3
    assert result["logprobs"] == only.json()["result"]["logprobs"]
    assert len(result["logprobs"][0]) == 4 and result["logprobs"][0][0] == 0.0


def snapshot_mock(server: Any) -> dict:
    model = next(iter(server.services.values())).model
    return {
        name: (
            {k: v.tobytes() for k, v in state.params.items()},
            {k: v.tobytes() for k, v in state.grads.items()},
            repr(state.train_totals),
        )
        for name, state in model._adapters.items()
    }


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level("CRITICAL", logger="twinkle")
