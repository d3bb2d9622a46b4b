"""The rest of the 0.38 SDK surface with the real SDK: sessions, user checkpoints, the batch
long-poll, the caller-scoped admin calls, auth token; another tenant sees none of it (404)."""

from __future__ import annotations

import logging
import time
import urllib.request
import warnings
from datetime import datetime, timedelta, timezone

import httpx
import pytest
import tinker
from sdk_version import needs_in_process_server, requires_sdk
from tinker import types

from twinkle.server.testing import KEYS

pytestmark = [pytest.mark.integration, requires_sdk("0.38", "the 0.38 REST surface")]

BASE_MODEL = "tiny/qwen3.5"
SEQ = list(range(20, 44))


@pytest.fixture(scope="module")
def clients(live_server):
    """(ServiceClient of a fresh alice session with project and name, its training client)."""
    from twinkle_client import init_tinker_client

    init_tinker_client()
    service = tinker.ServiceClient(
        base_url=live_server[0],
        api_key=KEYS["alice"],
        project_id="proj-rest",
        display_name="Nightly REST run",
        user_metadata={"suite": "rest"},
    )
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(SEQ[:-1]),
        loss_fn_inputs={"target_tokens": SEQ[1:], "weights": [1.0] * (len(SEQ) - 1)},
    )
    training.forward_backward([datum], "cross_entropy").result(timeout=60)
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=60)
    training.save_state("rest-state").result(timeout=60)
    sampler = training.save_weights_and_get_sampling_client().result(timeout=60)
    yield service, training, sampler
    service.close("success").result(timeout=30)


@pytest.fixture(scope="module")
def rest_bob(live_server):
    return tinker.RestClient(base_url=live_server[0], api_key=KEYS["bob"])


def session_id(service) -> str:
    return service.holder.get_session_id()


def test_client_config_turns_on_the_batch_long_poll(clients):
    service, _, sampler = clients
    assert service.holder.get_client_config().sample_use_retrieve_futures
    params = types.SamplingParams(max_tokens=3, temperature=1.0, seed=1)
    futures = [sampler.sample(types.ModelInput.from_ints(SEQ[:5]), 1, params) for _ in range(3)]
    for future in futures:  # each result came through the retrieve_futures poller
        assert 1 <= len(future.result(timeout=60).sequences[0].tokens) <= 3


def test_retrieve_futures_long_polls_and_reports_each_completion_once(live_server, clients):
    url, _ = live_server
    _, _, sampler = clients
    sid = sampler._sampling_session_id
    with httpx.Client(base_url=url, headers={"X-API-Key": KEYS["alice"]}, timeout=60) as http:
        body = {
            "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": SEQ[:4]}]},
            "sampling_params": {"max_tokens": 2, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
            "sampling_session_id": sid,
            "seq_id": 10_000,
        }
        rid = http.post("/api/v1/asample", json=body).json()["request_id"]
        target = {"type": "sampling_session", "sampling_session_id": sid, "cloned_sampler_id": 0}
        cursor, seen = 0, []
        deadline = time.monotonic() + 60
        while rid not in seen and time.monotonic() < deadline:
            reply = http.post(
                "/api/v1/retrieve_futures", json={"target": target, "prev_cursor": cursor}
            ).json()
            parsed = types.FuturesRetrieveResponse.model_validate(reply)
            seen += [c.request_id for c in parsed.completions]
            cursor = parsed.cursor
        assert rid in seen
        finished = [c for c in parsed.completions if c.request_id == rid][0]
        assert finished.state == "finished" and finished.response_payload_uncompressed_size > 0
        again = http.post(
            "/api/v1/retrieve_futures", json={"target": target, "prev_cursor": cursor, "timeout": 0}
        ).json()
        assert rid not in [c["request_id"] for c in again["completions"]]
        assert again["cursor"] == cursor
        bob = http.post(
            "/api/v1/retrieve_futures",
            json={"target": target, "prev_cursor": 0, "timeout": 0},
            headers={"X-API-Key": KEYS["bob"]},
        )
        assert bob.status_code == 404


def test_sessions_list_get_search_project_and_trace(clients, rest_bob):
    service, training, sampler = clients
    rest, sid = service.create_rest_client(), session_id(service)
    assert sid in rest.list_sessions(limit=100).result(timeout=30).sessions
    got = rest.get_session(sid).result(timeout=30)
    assert training.model_id in got.training_run_ids
    assert sampler._sampling_session_id in got.sampler_ids
    assert got.display_name == "Nightly REST run" and got.user_metadata == {"suite": "rest"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        page = rest.search_sessions(types.SessionSearchRequest(display_name="rest nightly")).result(
            timeout=30
        )
        summary = [s for s in page.sessions if s.session_id == sid][0]
        assert summary.project_id == "proj-rest" and summary.checkpoints_count >= 1
        assert summary.status.type == "active" and summary.checkpoint_storage_bytes > 0
        none = rest.search_sessions(
            types.SessionSearchRequest(display_name="no such name", project_ids=["proj-rest"])
        ).result(timeout=30)
        assert none.sessions == []
        other = _finished_session(rest.holder._base_url, "interrupted")
        one = rest.search_sessions(types.SessionSearchRequest(limit=1)).result(timeout=30)
        assert len(one.sessions) == 1 and one.next_cursor is not None
        nxt = rest.search_sessions(types.SessionSearchRequest(limit=1, cursor=one.next_cursor))
        assert nxt.result(timeout=30).sessions[0].session_id != one.sessions[0].session_id
        interrupted = types.ClientFinishedSessionStatusQuery(reasons=["interrupted"])
        closed = rest.search_sessions(types.SessionSearchRequest(statuses=[interrupted]))
        assert other in {s.session_id for s in closed.result(timeout=30).sessions}
    rest.assign_session_project(sid, "proj-moved").result(timeout=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        moved = rest.search_sessions(types.SessionSearchRequest(session_id=sid)).result(timeout=30)
    assert moved.sessions[0].project_id == "proj-moved"
    url = rest.export_session_trace(sid).result(timeout=30)
    with urllib.request.urlopen(url, timeout=30) as reply:  # no key: the URL is signed
        import json

        trace = json.loads(reply.read())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"forward_backward", "optim_step", "sample"} <= names
    for call in (
        rest_bob.get_session(sid),
        rest_bob.assign_session_project(sid, "steal"),
        rest_bob.export_session_trace(sid),
    ):
        with pytest.raises(tinker.NotFoundError):
            call.result(timeout=30)
    assert sid not in rest_bob.list_sessions(limit=1000).result(timeout=30).sessions


def _finished_session(url: str, reason: str) -> str:
    """A second session of alice, finished by its client with ``reason`` (raw HTTP: in-process
    ServiceClients with one key share their holder, and so their session)."""
    with httpx.Client(base_url=url, headers={"X-API-Key": KEYS["alice"]}, timeout=30) as http:
        sid = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
        finish = {"reason": {"type": reason}, "detail": "test"}
        http.post(f"/api/v1/sessions/{sid}/finish", json=finish).raise_for_status()
    return sid


def test_list_user_checkpoints_pages_with_a_cursor(clients, rest_bob):
    service, training, _ = clients
    rest = service.create_rest_client()
    full = rest.list_user_checkpoints(limit=1000).result(timeout=30)
    ours = [
        c for c in full.checkpoints if c.tinker_path.startswith(f"tinker://{training.model_id}/")
    ]
    assert "weights/rest-state" in {c.checkpoint_id for c in ours}
    assert full.cursor.total_count == len(full.checkpoints) >= 1
    page = rest.list_user_checkpoints(limit=1, offset=0).result(timeout=30)
    assert len(page.checkpoints) == 1 and page.cursor.limit == 1
    assert page.cursor.total_count == full.cursor.total_count
    times = [c.time for c in full.checkpoints]
    assert times == sorted(times, reverse=True)
    bob_paths = {
        c.tinker_path for c in rest_bob.list_user_checkpoints().result(timeout=30).checkpoints
    }
    assert not bob_paths & {c.tinker_path for c in full.checkpoints}
    with pytest.raises(tinker.NotFoundError):
        rest_bob.get_training_run(training.model_id).result(timeout=30)
    with pytest.raises(tinker.NotFoundError):
        rest_bob.list_checkpoints(training.model_id).result(timeout=30)


def test_checkpoint_ttl_delete_and_get_sampler(clients, rest_bob):
    service, training, sampler = clients
    rest = service.create_rest_client()
    path = training.save_state("rest-doomed").result(timeout=60).path

    def listed() -> dict:
        found = rest.list_checkpoints(training.model_id).result(timeout=30).checkpoints
        return {c.tinker_path: c for c in found}

    rest.set_checkpoint_ttl_from_tinker_path(path, 3600).result(timeout=30)
    assert listed()[path].expires_at is not None
    for call in (
        rest_bob.delete_checkpoint_from_tinker_path(path),
        rest_bob.set_checkpoint_ttl_from_tinker_path(path, None),
        rest_bob.get_sampler(sampler._sampling_session_id),
    ):
        with pytest.raises(tinker.NotFoundError):
            call.result(timeout=30)
    rest.delete_checkpoint_from_tinker_path(path).result(timeout=30)
    assert path not in listed()
    info = rest.get_sampler(sampler._sampling_session_id).result(timeout=30)
    assert info.sampler_id == sampler._sampling_session_id and info.base_model == BASE_MODEL


def test_admin_calls_see_the_callers_own_events_usage_and_storage(live_server, clients, rest_bob):
    service, training, _ = clients
    admin = tinker.AdminClient(base_url=live_server[0], api_key=KEYS["alice"])
    entries = admin.get_audit_log("checkpoints").result(timeout=30).entries
    created = [e for e in entries if e.event == "checkpoint_create"]
    assert f"tinker://{training.model_id}/weights/rest-state" in {e.tinker_path for e in created}
    assert all(e.event.startswith("checkpoint_") for e in entries)
    sid = session_id(service)
    everything = admin.get_audit_log().result(timeout=30).entries
    assert any(
        e.event == "session_create" and e.event_details["session_id"] == sid for e in everything
    )
    assert admin.get_audit_log("teams").result(timeout=30).entries == []
    today = datetime.now(timezone.utc).date()
    assert admin.get_audit_log(day=today).result(timeout=30).entries
    assert admin.get_audit_log(day=today - timedelta(days=3)).result(timeout=30).entries == []

    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    usage = admin.get_billing_usage(hour - timedelta(hours=1), hour + timedelta(hours=1)).result(
        timeout=30
    )
    mine = [e for e in usage.data if e.session_id == sid]
    kinds = {e.event_info.type: e.event_info for e in mine}
    assert kinds["training"].token_count == len(SEQ) - 1
    assert kinds["sampling_prefill"].token_count >= 5 and kinds["sampling_sample"].token_count >= 1
    assert kinds["checkpoint"].count >= 1
    assert all(e.estimated_cost_usd in (0.0, None) for e in usage.data)
    assert usage.sessions[sid].user_metadata == {"suite": "rest"}

    storage = admin.get_current_checkpoint_storage_usage().result(timeout=30)
    total = sum(
        c.size_bytes or 0
        for c in service.create_rest_client()
        .list_user_checkpoints(limit=1000)
        .result(timeout=30)
        .checkpoints
    )
    # Storage counts every byte kept, the unlisted snapshots behind sampling clients too.
    owner = live_server[1].context.authenticate({"x-api-key": KEYS["alice"]})
    kept = sum(c.size_bytes or 0 for c in live_server[1].context.state.checkpoints_of(owner))
    assert sum(i.size_bytes for i in storage.data) == kept >= total > 0
    assert storage.effective_rate_usd_per_gigabyte_month == 0.0

    bob_admin = tinker.AdminClient(base_url=live_server[0], api_key=KEYS["bob"])
    bob_events = bob_admin.get_audit_log().result(timeout=30).entries
    assert sid not in {e.event_details.get("session_id") for e in bob_events}
    assert training.model_id not in {e.model_id for e in bob_events}
    bob_usage = bob_admin.get_billing_usage(
        hour - timedelta(hours=1), hour + timedelta(hours=1)
    ).result(timeout=30)
    assert sid not in {e.session_id for e in bob_usage.data}
    bob_storage = bob_admin.get_current_checkpoint_storage_usage().result(timeout=30)
    assert sum(i.size_bytes for i in bob_storage.data) != total or total == 0


def test_auth_token_names_the_caller(live_server):
    from tinker.lib._jwt_auth import jwt_claims

    with httpx.Client(base_url=live_server[0], timeout=30) as http:
        alice = http.post("/api/v1/auth/token", json={}, headers={"X-API-Key": KEYS["alice"]})
        bob = http.post("/api/v1/auth/token", json={}, headers={"X-API-Key": KEYS["bob"]})
        anonymous = http.post("/api/v1/auth/token", json={})
    a, b = (jwt_claims(types.AuthTokenResponse.model_validate(r.json()).jwt) for r in (alice, bob))
    assert a["sub"] != b["sub"] and a["exp"] > time.time() and a["sub"].endswith(a["org_id"])
    assert anonymous.status_code == 401


@needs_in_process_server
def test_unknown_request_fields_are_ignored_and_logged_once(live_server, clients, caplog):
    url, _ = live_server
    _, training, _ = clients
    body = {"model_id": training.model_id, "field_from_a_newer_sdk": {"x": 1}}
    with httpx.Client(base_url=url, headers={"X-API-Key": KEYS["alice"]}, timeout=30) as http:
        with caplog.at_level(logging.WARNING, logger="twinkle.server.tinker"):
            first = http.post("/api/v1/get_info", json=body)
            second = http.post("/api/v1/get_info", json=body)
    assert first.status_code == second.status_code == 200
    assert first.json()["model_id"] == training.model_id
    logged = [r for r in caplog.records if "field_from_a_newer_sdk" in r.getMessage()]
    assert len(logged) == 1
