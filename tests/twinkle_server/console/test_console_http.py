"""The console over HTTP, without a browser: its page and assets, its JSON routes, isolation
between keys, the operator view for admin keys only, and live adapters in the OpenAI model list.
"""

from __future__ import annotations

import httpx
import pytest
from console_server import BASE, KEYS, auth

from twinkle.server.state.paths import tenant_id_for_key

CONSOLE = "/api/v1/console"


@pytest.fixture(scope="module")
def http(url):
    with httpx.Client(base_url=url, timeout=120) as client:
        yield client


def test_the_page_and_its_assets_need_no_key_and_name_their_types(http):
    moved = http.get(CONSOLE, follow_redirects=False)
    assert moved.status_code == 307 and moved.headers["location"] == "console/"
    page = http.get(CONSOLE + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="static/console.js"' in page.text and 'href="static/console.css"' in page.text
    script = http.get(CONSOLE + "/static/console.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "sessionStorage" in script.text
    style = http.get(CONSOLE + "/static/console.css")
    assert style.headers["content-type"].startswith("text/css")


@pytest.mark.parametrize("name", ["missing.js", "..%2Fconsole.js", "__init__.py"])
def test_files_outside_the_assets_are_404(http, name):
    assert http.get(f"{CONSOLE}/static/{name}").status_code == 404


def test_me_names_the_tenant_and_whether_it_is_an_operator(http):
    assert http.get(CONSOLE + "/api/me").status_code == 401
    assert http.get(CONSOLE + "/api/me", headers={"X-API-Key": "wrong"}).status_code == 401
    alice = http.get(CONSOLE + "/api/me", headers=auth("alice")).json()
    assert alice == {"tenant_id": tenant_id_for_key(KEYS["alice"]), "admin": False}
    ops = http.get(CONSOLE + "/api/me", headers=auth("admin")).json()
    assert ops == {"tenant_id": tenant_id_for_key(KEYS["admin"]), "admin": True}


def test_sessions_list_the_callers_own_with_their_runs(http, alice_run):
    run_id, _ = alice_run
    alice = http.get(CONSOLE + "/api/sessions", headers=auth("alice")).json()["sessions"]
    assert [s["training_run_ids"] for s in alice if run_id in s["training_run_ids"]] == [[run_id]]
    bob = http.get(CONSOLE + "/api/sessions", headers=auth("bob")).json()["sessions"]
    assert all(run_id not in s["training_run_ids"] for s in bob)
    assert not {s["session_id"] for s in alice} & {s["session_id"] for s in bob}


def test_another_key_sees_none_of_alices_runs_history_or_checkpoints(http, alice_run):
    run_id, path = alice_run
    runs = http.get("/api/v1/training_runs", headers=auth("bob")).json()["training_runs"]
    assert run_id not in {r["training_run_id"] for r in runs}
    for route in (
        f"/training_runs/{run_id}",
        f"/training_runs/{run_id}/history",
        f"/training_runs/{run_id}/checkpoints",
    ):
        assert http.get("/api/v1" + route, headers=auth("bob")).status_code == 404
        assert http.get("/api/v1" + route, headers=auth("alice")).status_code == 200
    info = http.get("/api/v1/checkpoint_info", params={"twinkle_path": path}, headers=auth("bob"))
    assert info.status_code == 404


def test_the_operator_view_is_403_for_tenants_and_lists_every_tenant_for_admins(http, alice_run):
    run_id, _ = alice_run
    for who in ("alice", "bob"):
        refused = http.get(CONSOLE + "/api/admin", headers=auth(who))
        assert refused.status_code == 403 and "admin key" in refused.json()["error"]
    assert http.get(CONSOLE + "/api/admin").status_code == 401
    view = http.get(CONSOLE + "/api/admin", headers=auth("admin")).json()
    alice = tenant_id_for_key(KEYS["alice"])
    (row,) = [t for t in view["tenants"] if t["tenant_id"] == alice]
    assert row["runs"] >= 1 and row["loaded_adapters"] >= 1 and row["steps"] >= 2
    adapters = {(a["tenant_id"], a["training_run_id"]): a for a in view["adapters"]}
    assert adapters[(alice, run_id)]["adapter_name"] == "ca"
    assert adapters[(alice, run_id)]["base_model"] == BASE
    capacity = view["capacity"][BASE]
    assert capacity["max_loras"] == 4
    assert capacity["used_loras"] + capacity["free_loras"] == capacity["max_loras"]


def test_queue_positions_count_every_tenants_earlier_calls_and_show_only_the_callers(
    http, server, alice_run
):
    """A Tinker call's future names its run; its line is the run's base model."""
    run_id, _ = alice_run
    state = server.context.state
    alice, bob = tenant_id_for_key(KEYS["alice"]), tenant_id_for_key(KEYS["bob"])
    made = [
        state.create_future(bob, "forward_backward", model_id="queue-test"),
        state.create_future(alice, "forward_backward", model_id="queue-test"),
        state.create_future(bob, "optim_step", model_id="queue-test"),
        state.create_future(alice, "sample", model_id="queue-test"),
        state.create_future(alice, "optim_step", model_id=run_id),
    ]
    try:
        mine = http.get(CONSOLE + "/api/queue", headers=auth("alice")).json()["pending"]
        assert [(c["request_id"], c["kind"], c["model"], c["position"], c["of"]) for c in mine] == [
            (made[1].request_id, "forward_backward", "queue-test", 2, 4),
            (made[3].request_id, "sample", "queue-test", 4, 4),
            (made[4].request_id, "optim_step", BASE, 1, 1),
        ]
        theirs = http.get(CONSOLE + "/api/queue", headers=auth("bob")).json()["pending"]
        assert [(c["model"], c["position"]) for c in theirs] == [
            ("queue-test", 1),
            ("queue-test", 3),
        ]
        assert {c["request_id"] for c in theirs} == {made[0].request_id, made[2].request_id}
        view = http.get(CONSOLE + "/api/admin", headers=auth("admin")).json()
        assert view["pending_by_model"] == {"queue-test": {alice: 2, bob: 2}, BASE: {alice: 1}}
    finally:
        for future in made:
            state.complete_future(future.owner, future.request_id, {})


def test_openai_models_list_the_callers_live_adapters_only(http, alice_run):
    def ids(who):
        reply = http.get("/api/v1/openai/v1/models", headers=auth(who))
        assert reply.status_code == 200, reply.text
        return [m["id"] for m in reply.json()["data"]]

    _, path = alice_run
    alice = ids("alice")
    assert alice[0] == BASE and "inflight://ca" in alice and path in alice
    assert ids("bob") == [BASE]
    live = http.get("/api/v1/openai/v1/models/inflight://ca", headers=auth("alice")).json()
    assert live["id"] == "inflight://ca" and live["parent"] == BASE
