"""Tenant isolation on every route: another key naming alice's ids gets 404 and changes nothing.

The routes are read from the server itself (each application's FastAPI routes, each ``POST
/{op}`` expanded into the operations that application serves): a route added without a case here
fails :func:`test_every_served_route_has_an_isolation_case`. For each route that takes an id
(session, training run / Tinker model, checkpoint, sampling session, future, custom loss, dataset,
adapter name, signed download), bob sends alice's id and must get 404, not 403 (existence must not
leak) and alice's state must be equal before and after: store records, files, adapter entries,
adapter weights, gradients and optimizer state (bytes), Tinker lanes, datasets, custom losses.
Routes without an id (lists, health, creation in the caller's own namespace) must not show bob
any of alice's ids, and change nothing of hers either.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from _isolation_world import (
    BASE,
    PREFIXES,
    World,
    build,
    ce_graph,
    changes,
    done,
    fb_proto,
    features,
    processor,
    sample_body,
    snapshot,
)

pytestmark = pytest.mark.integration

DOCS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
PROTO = {"content-type": "application/x-protobuf"}


@dataclass
class Req:
    """One request of bob's; ``expect`` is its status (404 for another tenant's id)."""

    method: str
    url: str
    json: Any = None
    content: Callable[[dict], bytes] | None = None
    expect: int = 404
    headers: dict[str, str] = field(default_factory=dict)
    who: str | None = "bob"


I = Callable[[dict], list[Req]]  # noqa: E741 - ids -> bob's requests for one route


def _ckpt(path: str) -> str:
    """``twinkle://run/kind/name`` or ``tinker://...`` -> ``run/checkpoints/kind/name``."""
    run, _, rest = path.split("://", 1)[1].partition("/")
    return f"{run}/checkpoints/{rest}"


def gw(method: str, path: str, **kw) -> Req:
    return Req(method, PREFIXES["gateway"] + path, **kw)


def model_op(op: str, extra: dict | None = None, adapters=("alice_native", "alice_model")) -> I:
    """Bob calls ``op`` on each of alice's adapters (native name and Tinker model id)."""
    return lambda i: [
        Req("POST", f"{PREFIXES['model']}/{op}", json={"adapter_name": i[a], **(extra or {})})
        for a in adapters
    ]


def on_own_adapter(op: str, field_name: str) -> I:
    """Bob's own adapter, alice's checkpoint (native and Tinker path): 404 for the checkpoint."""
    return lambda i: [
        Req("POST", f"{PREFIXES['model']}/{op}", json={"adapter_name": "mine", field_name: i[c]})
        for c in ("alice_ckpt", "alice_state")
    ]


def dataset_op(op: str, extra: dict | None = None) -> I:
    return lambda i: [
        Req("POST", f"{PREFIXES['processor']}/{op}", json={"dataset": i["alice_dataset"], **(extra or {})})
    ]  # fmt: skip


def runs(method: str, suffix: str = "", **kw) -> I:
    """The route for each of alice's runs (native and Tinker)."""
    return lambda i: [
        gw(method, f"/training_runs/{i[r]}{suffix}", **kw) for r in ("alice_run", "alice_model")
    ]


def ckpts(method: str, suffix: str = "", **kw) -> I:
    """The route for each of alice's checkpoints (native weights, Tinker state and sampler)."""
    keys = ("alice_ckpt", "alice_state", "alice_sampler_path")
    return lambda i: [gw(method, f"/training_runs/{_ckpt(i[k])}{suffix}", **kw) for k in keys]


def sessions(method: str, suffix: str = "", **kw) -> I:
    return lambda i: [gw(method, f"/sessions/{i['alice_session']}{suffix}", **kw)]


def fb(i: dict) -> list[Req]:
    return [Req("POST", "/api/v1/forward_backward", content=lambda i: fb_proto(i["alice_model"], 7), headers=PROTO)]  # fmt: skip


def body(method: str, path: str, make: Callable[[dict], dict]) -> I:
    return lambda i: [gw(method, path, json=make(i))]


GRAPH = ce_graph()
TINKER_TRAIN = {"seq_id": 9, "adam_params": {"learning_rate": 1.0}}

# Routes that take one of alice's ids: bob must get 404 and change nothing.
ID_ROUTES: dict[str, I] = {
    # ------------------------------------------------------------- Twinkle / shared gateway
    "POST gateway:/session_heartbeat": body("POST", "/session_heartbeat", lambda i: {"session_id": i["alice_session"]}),
    "POST gateway:/sessions/{session_id}/finish": sessions("POST", "/finish", json={}),
    "GET gateway:/training_runs/{run_id}": runs("GET"),
    "GET gateway:/training_runs/{run_id}/checkpoints": runs("GET", "/checkpoints"),
    "GET gateway:/training_runs/{run_id}/history": runs("GET", "/history"),
    "DELETE gateway:/training_runs/{run_id}/checkpoints/{kind}/{name}": ckpts("DELETE"),
    "PUT gateway:/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl": ckpts("PUT", "/ttl", json={"ttl_seconds": 1}),
    # ------------------------------------------------------------- Tinker
    "POST gateway:/create_model": body("POST", "/create_model", lambda i: {"session_id": i["alice_session"], "model_seq_id": 5, "base_model": BASE}),
    "POST gateway:/get_info": body("POST", "/get_info", lambda i: {"model_id": i["alice_model"]}),
    "POST gateway:/forward_backward": fb,
    "POST gateway:/optim_step": body("POST", "/optim_step", lambda i: {"model_id": i["alice_model"], **TINKER_TRAIN}),
    "POST gateway:/unload_model": body("POST", "/unload_model", lambda i: {"model_id": i["alice_model"]}),
    "POST gateway:/create_custom_loss": body("POST", "/create_custom_loss", lambda i: {"session_id": i["alice_session"], "custom_loss_seq_id": 3, "name": "x", "graph": GRAPH[0], "inputs": GRAPH[1]}),
    "POST gateway:/save_weights": body("POST", "/save_weights", lambda i: {"model_id": i["alice_model"], "seq_id": 9, "path": "stolen", "overwrite": True}),
    "POST gateway:/save_weights_for_sampler": body("POST", "/save_weights_for_sampler", lambda i: {"model_id": i["alice_model"], "seq_id": 9, "path": "stolen"}),
    "POST gateway:/load_weights": lambda i: [
        gw("POST", "/load_weights", json={"model_id": i["alice_model"], "seq_id": 9, "path": i["bob_ckpt"]}),
        gw("POST", "/load_weights", json={"model_id": i["bob_model"], "seq_id": 1, "path": i["alice_state"]}),
        gw("POST", "/load_weights", json={"session_id": i["bob_session"], "model_seq_id": 7, "path": i["alice_state"], "optimizer": True}),
    ],
    "POST gateway:/weights_info": lambda i: [gw("POST", "/weights_info", json={"tinker_path": i[k]}) for k in ("alice_state", "alice_ckpt")],
    "POST gateway:/training_runs/{run_id}/checkpoints/{kind}/{name}/publish": ckpts("POST", "/publish"),
    "DELETE gateway:/training_runs/{run_id}/checkpoints/{kind}/{name}/publish": ckpts("DELETE", "/publish"),
    "POST gateway:/copy_weights": body("POST", "/copy_weights", lambda i: {"source_path": i["alice_state"], "session_id": i["bob_session"], "model_seq_id": 8}),
    "POST gateway:/save_weights_external": body("POST", "/save_weights_external", lambda i: {"model_id": i["alice_model"], "seq_id": 9, "path": "stolen"}),
    "GET gateway:/training_runs/{run_id}/checkpoints/{kind}/{name}/external_weights_urls": lambda i: [gw("GET", f"/training_runs/{_ckpt(i['alice_external'])}/external_weights_urls")],
    "GET gateway:/training_runs/{run_id}/checkpoints/{kind}/{name}/archive": ckpts("GET", "/archive"),
    "POST gateway:/join_sampling_session": body("POST", "/join_sampling_session", lambda i: {"sampling_session_id": i["alice_sampler"]}),
    "POST gateway:/create_sampling_session": lambda i: [
        gw("POST", "/create_sampling_session", json={"session_id": i["alice_session"], "sampling_session_seq_id": 5, "base_model": BASE}),
        gw("POST", "/create_sampling_session", json={"session_id": i["bob_session"], "sampling_session_seq_id": 5, "model_path": i["alice_sampler_path"]}),
    ],
    "GET gateway:/samplers/{sampler_id}": lambda i: [gw("GET", f"/samplers/{i['alice_sampler']}")],
    "POST gateway:/asample": lambda i: [
        gw("POST", "/asample", json=sample_body(i)),
        gw("POST", "/asample", json={**sample_body(i), "sampling_session_id": None, "model_path": i["alice_sampler_path"]}),
    ],
    "POST gateway:/retrieve_future": body("POST", "/retrieve_future", lambda i: {"request_id": i["alice_future"]}),
    "POST gateway:/retrieve_futures": body("POST", "/retrieve_futures", lambda i: {"target": {"type": "sampling_session", "sampling_session_id": i["alice_sampler"]}, "prev_cursor": 0, "timeout": 0}),
    "GET gateway:/sessions/{session_id}": sessions("GET"),
    "PUT gateway:/sessions/{session_id}/project": sessions("PUT", "/project", json={"project_id": "stolen"}),
    "GET gateway:/sessions/{session_id}/trace_export": sessions("GET", "/trace_export"),
    "GET gateway:/trace_exports/{token}": lambda i: [gw("GET", f"/trace_exports/{i['alice_trace_token'][:-2]}xx", who=None)],
    # ------------------------------------------------------------- model deployment
    **{f"POST model:/{op}": model_op(op, extra) for op, extra in {
        "remove_adapter": {}, "set_template": {"template": "Template"},
        "set_processor": {"processor": "InputProcessor"}, "set_loss": {"loss": "CrossEntropyLoss"},
        "set_optimizer": {"optimizer": "SGD", "lr": 1.0}, "set_lr_scheduler": {"scheduler": "LinearLR"},
        "forward": {"inputs": features()}, "forward_only": {"inputs": features()},
        "forward_backward": {"inputs": features()}, "calculate_loss": {}, "backward": {},
        "clip_grad_norm": {}, "step": {}, "zero_grad": {}, "lr_step": {}, "clip_grad_and_step": {},
        "optim_step": {"adam_params": {"learning_rate": 1.0}}, "calculate_metric": {},
        "get_train_configs": {}, "save": {"name": "stolen"},
        "upload_adapter": {"name": "stolen", "files": {}},
        "tinker_optim_step": {"adam_params": {"learning_rate": 1.0}}, "tinker_adapter_info": {},
        "tinker_save_external": {"name": "stolen"}, "tinker_adapter_state": {},
        "adapter_tensors": {}, "save_checkpoint": {"name": "stolen"},
        "delete_checkpoint": {"run_id": "stolen", "kind": "weights", "name": "stolen"},
    }.items()},  # fmt: skip
    "POST model:/add_metric": model_op("add_metric", {"metric_cls": "LossMetric"}),
    "POST model:/get_state_dict": model_op("get_state_dict"),
    # The OpenAI-compatible API: alice's checkpoints and live adapter are no model of bob's.
    "GET gateway:/openai/v1/models/{model:path}": lambda i: [gw("GET", f"/openai/v1/models/{i[c]}") for c in ("alice_ckpt", "alice_state")],
    "POST gateway:/openai/v1/chat/completions": lambda i: [gw("POST", "/openai/v1/chat/completions", json={"model": m, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}) for m in (i["alice_ckpt"], i["alice_state"], f"inflight://{i['alice_model']}")],
    "POST gateway:/openai/v1/completions": lambda i: [gw("POST", "/openai/v1/completions", json={"model": m, "prompt": [20, 21, 22], "max_tokens": 1}) for m in (i["alice_ckpt"], i["alice_state"], f"inflight://{i['alice_model']}")],
    # Merged exports: bob cannot merge, publish or read the status of alice's checkpoints.
    "POST gateway:/merged_exports": lambda i: [gw("POST", "/merged_exports", json={"twinkle_path": i[c]}) for c in ("alice_ckpt", "alice_state")],
    "POST gateway:/merged_exports/publish": lambda i: [gw("POST", "/merged_exports/publish", json={"twinkle_path": i[c], "repo_id": "bob/stolen", "hub": "hf", "token": "hf_x"}) for c in ("alice_ckpt", "alice_state")],
    "GET gateway:/merged_exports/{export_id}": lambda i: [gw("GET", "/merged_exports/" + "0" * 24)],
    "GET gateway:/merged_exports/publish/{publish_id}": lambda i: [gw("GET", "/merged_exports/publish/" + "0" * 24)],
    # A file URL's signature is its credential: a forged one is refused before any lookup.
    "GET gateway:/merged_export_files/{export_id}/{name}": lambda i: [gw("GET", "/merged_export_files/" + "0" * 24 + "/config.json?expires=9999999999&signature=forged", who=None, expect=403)],
    "GET gateway:/checkpoint_info": lambda i: [gw("GET", f"/checkpoint_info?twinkle_path={i[c]}") for c in ("alice_ckpt", "alice_state")],
    # SDKs before 0.27 send forward passes as JSON.
    "POST gateway:/forward": body("POST", "/forward", lambda i: {"model_id": i["alice_model"], "seq_id": 9, "forward_input": {"data": [], "loss_fn": "cross_entropy"}}),
    "POST model:/load": on_own_adapter("load", "path"),
    "POST model:/resume_from_checkpoint": on_own_adapter("resume_from_checkpoint", "path"),
    "POST model:/upload_to_hub": lambda i: [
        Req("POST", f"{PREFIXES['model']}/upload_to_hub", json={"checkpoint_dir": i[c], "hub_model_id": "bob/stolen"})
        for c in ("alice_ckpt", "alice_state")
    ],
    # Bob names alice's adapters to have them handed to his sampler: 404, nothing published.
    "POST gateway:/publish_live_adapter": lambda i: [
        gw("POST", "/publish_live_adapter", json={"base_model": BASE, "adapter_name": i[a]})
        for a in ("alice_native", "alice_model")
    ],
    # ------------------------------------------------------------- sampler deployment
    "POST sampler:/sample": lambda i: [
        Req("POST", f"{PREFIXES['sampler']}/sample", json={"inputs": [SEQ_IDS], "adapter_uri": i[c]})
        for c in ("alice_sampler_path", "alice_ckpt")
    ] + [
        Req("POST", f"{PREFIXES['sampler']}/sample", json={"inputs": [SEQ_IDS], "adapter_uri": f"inflight://{i[a]}"})
        for a in ("alice_native", "alice_model")
    ],
    # ------------------------------------------------------------- processor
    **{f"POST processor:/{op}": dataset_op(op, extra) for op, extra in {
        "set_template": {"template": "Template"}, "map": {"preprocessor": "SelfCognitionProcessor"},
        "filter": {}, "encode": {}, "len": {}, "rows": {"indices": [0]}, "delete_dataset": {},
    }.items()},  # fmt: skip
}  # fmt: skip
SEQ_IDS = [20, 21, 22, 23]

# Unkeyed download routes: the URL's signature is the credential, checked before any look-up,
# so a forged one is refused the same way (403) for alice's real ids as for ids that do not
# exist: nothing about existence leaks (asserted by comparing the two answers).
SIGNED: dict[str, Callable[[dict], str]] = {
    "GET gateway:/external_weights_files/{owner}/{run_id}/{name}/{rel:path}": lambda i: i["alice_download"],
    "GET gateway:/checkpoint_archives/{owner}/{run_id}/{kind}/{archive}": lambda i: i["alice_archive"],
}  # fmt: skip

# Routes without an id of anyone else's: bob's own lists, health, creation in his own namespace.
# Bob's answer must name none of alice's ids, and alice's state must not change.
NO_ID: dict[str, I] = {
    "GET gateway:/healthz": lambda i: [gw("GET", "/healthz", expect=200)],
    "GET gateway:/get_server_capabilities": lambda i: [gw("GET", "/get_server_capabilities", expect=200)],
    "GET gateway:/routes": lambda i: [gw("GET", "/routes", expect=200)],
    "POST gateway:/create_session": lambda i: [gw("POST", "/create_session", json={}, expect=200)],
    "GET gateway:/training_runs": lambda i: [gw("GET", "/training_runs?limit=1000", expect=200)],
    "GET gateway:/openai/v1/models": lambda i: [gw("GET", "/openai/v1/models", expect=200)],
    # The web console: its page and assets hold no data; its JSON answers the caller's own.
    "GET gateway:/console": lambda i: [gw("GET", "/console", expect=307)],
    "GET gateway:/console/": lambda i: [gw("GET", "/console/", expect=200)],
    "GET gateway:/console/static/{name}": lambda i: [gw("GET", "/console/static/console.js", expect=200)],
    "GET gateway:/console/api/me": lambda i: [gw("GET", "/console/api/me", expect=200)],
    "GET gateway:/console/api/sessions": lambda i: [gw("GET", "/console/api/sessions", expect=200)],
    "GET gateway:/console/api/queue": lambda i: [gw("GET", "/console/api/queue", expect=200)],
    # Bob's key is no admin key: the operator view refuses him.
    "GET gateway:/console/api/admin": lambda i: [gw("GET", "/console/api/admin", expect=403)],
    # Bob's own live adapters (keyed by API key): none of alice's.
    "POST sampler:/live_adapters": lambda i: [Req("POST", f"{PREFIXES['sampler']}/live_adapters", json={}, expect=200)],
    "POST gateway:/client/config": lambda i: [gw("POST", "/client/config", json={}, expect=200)],
    "POST gateway:/client/dynamic_config": lambda i: [gw("POST", "/client/dynamic_config", json={}, expect=200)],
    "POST gateway:/telemetry": lambda i: [gw("POST", "/telemetry", json={}, expect=200)],
    "POST gateway:/cancel_future": lambda i: [gw("POST", "/cancel_future", json={"request_id": i["alice_future"]}, expect=404)],
    "GET gateway:/sessions": lambda i: [gw("GET", "/sessions?limit=1000", expect=200)],
    "POST gateway:/sessions/search": lambda i: [gw("POST", "/sessions/search", json={"session_id": i["alice_session"]}, expect=200)],
    "GET gateway:/checkpoints": lambda i: [gw("GET", "/checkpoints?limit=1000", expect=200)],
    "GET gateway:/audit": lambda i: [gw("GET", "/audit", expect=200)],
    "GET gateway:/billing/usage/events": lambda i: [gw("GET", "/billing/usage/events?starting_on=2000-01-01&ending_before=2100-01-01", expect=200)],
    "GET gateway:/billing/usage/checkpoints/current": lambda i: [gw("GET", "/billing/usage/checkpoints/current", expect=200)],
    "POST gateway:/auth/token": lambda i: [gw("POST", "/auth/token", json={}, expect=200)],
    "GET gateway:/auth/apikey/me": lambda i: [gw("GET", "/auth/apikey/me", expect=200)],
    "DELETE gateway:/auth/apikey/me": lambda i: [gw("DELETE", "/auth/apikey/me", expect=403)],
    "GET gateway:/capacity_info": lambda i: [gw("GET", "/capacity_info", expect=200)],
    "POST model:/capacity_info": lambda i: [Req("POST", f"{PREFIXES['model']}/capacity_info", json={}, expect=200)],
    # Upload ids are per key: one bob never started is unknown to him.
    "POST model:/upload_status": lambda i: [Req("POST", f"{PREFIXES['model']}/upload_status", json={"upload_id": "u-not-bobs"}, expect=404)],
    # Bob declares a sampler adapter named like alice's: names are per key.
    "POST sampler:/add_adapter_to_sampler": lambda i: [Req("POST", f"{PREFIXES['sampler']}/add_adapter_to_sampler", json={"adapter_name": i["alice_native"], "config": {"r": 4}}, expect=200)],
    "GET model:/healthz": lambda i: [Req("GET", f"{PREFIXES['model']}/healthz", expect=200)],
    "GET model:/endpoint": lambda i: [Req("GET", f"{PREFIXES['model']}/endpoint", expect=200)],
    "GET model:/status": lambda i: [Req("GET", f"{PREFIXES['model']}/status", expect=200)],
    # Bob's own adapter named like alice's: a tenant of its own (names are per key).
    "POST model:/add_adapter_to_model": lambda i: [Req("POST", f"{PREFIXES['model']}/add_adapter_to_model", json={"adapter_name": i["alice_native"], "config": {"r": 4}}, expect=200)],
    "GET sampler:/healthz": lambda i: [Req("GET", f"{PREFIXES['sampler']}/healthz", expect=200)],
    "POST sampler:/set_template": lambda i: [Req("POST", f"{PREFIXES['sampler']}/set_template", json={"template": "Template"}, expect=200)],
    # An inflight:// key is the caller's own (keyed by API key): alice's model id names
    # nothing of hers; an empty payload is refused as bad input.
    "POST sampler:/publish_adapter": lambda i: [Req("POST", f"{PREFIXES['sampler']}/publish_adapter", json={"adapter_uri": f"inflight://{i['alice_model']}"}, expect=400)],
    "GET processor:/healthz": lambda i: [Req("GET", f"{PREFIXES['processor']}/healthz", expect=200)],
    "POST processor:/create_dataset": lambda i: [Req("POST", f"{PREFIXES['processor']}/create_dataset", json={"dataset_meta": {"data": [{"text": "b"}]}}, expect=200)],
}  # fmt: skip


# ----------------------------------------------------------------------------- the route table
def _walk(routes) -> list[Any]:
    out = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        out += _walk(inner.routes) if inner is not None else [route]
    return out


def _ops(world: World, app: str) -> list[str]:
    if app == "model":
        return world.server.services["model"].operations.names()
    if app == "processor":
        return sorted(processor(world).state.service.ops)
    service = world.server.services["sampler"]
    try:  # the sampler names its operations in the 404 of an unknown one
        asyncio.run(service.call("nobody", "no-such-op"))
    except Exception as exc:  # noqa: BLE001
        return re.search(r"known: (.*)$", str(exc)).group(1).split(", ")
    raise AssertionError("the sampler accepted an unknown operation")


def served_routes(world: World) -> set[str]:
    """``"METHOD app:/path"`` of every route the server answers, ``/{op}`` expanded."""
    names = {prefix: app for app, prefix in PREFIXES.items()}
    served = set()
    for mount in world.server.app.routes:
        app = names[mount.path]
        for route in _walk(mount.app.routes):
            if route.path in DOCS:
                continue
            for method in sorted(set(route.methods) - {"HEAD"}):
                if route.path == "/{op}":
                    served |= {f"{method} {app}:/{op}" for op in _ops(world, app)}
                else:
                    served.add(f"{method} {app}:{route.path}")
    return served


@pytest.fixture(scope="module")
def world_and_results(tmp_path_factory):
    """Build the world and run every case in one event loop (see _isolation_world)."""
    root = tmp_path_factory.mktemp("isolation")

    async def scenario():
        world = await build(root)
        results = {}
        for key, make in {**ID_ROUTES, **NO_ID}.items():
            results[key] = [await _judge(world, req) for req in make(world.ids)]
        for key, path in SIGNED.items():
            results[key] = [await _judge_signed(world, path(world.ids))]
        return world, results

    return asyncio.run(scenario())


def _alice_ids(ids: dict) -> set[str]:
    out = set()
    for key, value in ids.items():
        if key.startswith("alice_") and isinstance(value, str) and len(value) > 4:
            out.add(value)
            out.add(value.split("/")[-1]) if "://" in value else None
    return out


async def _judge(world: World, req: Req) -> list[str]:
    before = snapshot(world)
    kwargs: dict[str, Any] = {"headers": req.headers}
    if req.content is not None:
        kwargs["content"] = req.content(world.ids)
    elif req.json is not None:
        kwargs["json"] = req.json
    async with world.http(req.who) as http:
        reply = await http.request(req.method, req.url, **kwargs)
        json_reply = reply.headers.get("content-type", "").startswith("application/json")
        if reply.status_code == 200 and json_reply and "request_id" in (reply.json() or {}):
            # A future: its outcome counts (alice's state must still be equal after it ran).
            try:
                await done(http, reply.json())
            except AssertionError:
                pass  # a failed future of bob's own: only alice's state is judged
    problems = []
    where = f"{req.method} {req.url}"
    if reply.status_code != req.expect:
        problems.append(f"{where}: {reply.status_code} (wanted {req.expect}): {reply.text[:200]}")
    if req.expect == 200:
        leaked = [v for v in _alice_ids(world.ids) if v in reply.text and v not in str(req.json)]
        if leaked:
            problems.append(f"{where}: shows alice's {leaked}")
    changed = changes(before, snapshot(world))
    if changed:
        problems.append(f"{where}: changed alice's state: {changed[:6]}")
    return problems


async def _judge_signed(world: World, path: str) -> list[str]:
    """A forged signature on alice's real download path answers exactly as on a made-up path."""
    base = PREFIXES["gateway"]
    fake = re.sub(r"[0-9a-f]{8,}", lambda m: "0" * len(m.group()), path)
    query = "?expires=9999999999&signature=" + "0" * 64
    before = snapshot(world)
    async with world.http(None) as http:
        real = await http.get(base + path + query)
        made_up = await http.get(base + fake + query)
    problems = []
    answers = [(r.status_code, {k: v for k, v in r.json().items() if k != "request_id"})
               for r in (real, made_up)]  # fmt: skip
    if real.status_code not in (403, 404) or answers[0] != answers[1]:
        problems.append(f"{path}: {real.status_code} {real.text} vs {made_up.text}")
    if changes(before, snapshot(world)):
        problems.append(f"{path}: changed alice's state")
    return problems


def test_every_served_route_has_an_isolation_case(world_and_results):
    world, _ = world_and_results
    served = served_routes(world)
    covered = set(ID_ROUTES) | set(NO_ID) | set(SIGNED)
    assert served - covered == set(), "routes without an isolation case"
    assert covered - served == set(), "cases for routes the server does not serve"
    assert len(ID_ROUTES) + len(SIGNED) >= 60


@pytest.mark.parametrize("route", sorted({**ID_ROUTES, **NO_ID, **SIGNED}))
def test_another_key_gets_404_and_changes_nothing(world_and_results, route):
    _, results = world_and_results
    problems = [p for req in results[route] for p in req]
    assert results[route] and not problems, "\n".join(problems)
