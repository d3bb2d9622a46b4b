"""The isolation world: one in-process server where tenant alice owns one of every kind of object
and tenant bob owns a few of his own, the routes it serves, and a snapshot of alice's state.

Everything runs in ONE event loop (:func:`build` inside the test's ``asyncio.run``): the Tinker
futures and their per-model lanes are bound to the loop that made them.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from twinkle.server.state.paths import tenant_id_for_key  # noqa: E402
from twinkle.server.testing import KEYS, config_dict  # noqa: E402

BASE = "tiny/qwen3"
PREFIXES = {
    "model": f"/api/v1/model/{BASE}",
    "sampler": f"/api/v1/sampler/{BASE}",
    "processor": "/api/v1/processor",
    "gateway": "/api/v1",
}
SEQ = list(range(20, 36))
BOB = tenant_id_for_key(KEYS["bob"])


def server_config(root: Path) -> dict:
    config = config_dict(model_id="tiny://qwen3", sampler=True, max_loras=8)
    config["applications"][0]["args"]["server_config"]["per_token_model_limit"] = 8
    config["applications"].append(
        {"name": "processor", "route_prefix": PREFIXES["processor"], "import_path": "processor"}
    )
    config["storage"] = {"root": str(root / "storage")}
    return config


def features(rows: int = 2, seq: int = 10) -> list[dict]:
    return [
        {"input_ids": [10 + r + t for t in range(seq)], "labels": [-100] * 3 + [20] * (seq - 3)}
        for r in range(rows)
    ]


def fb_proto(model_id: str, seq_id: int) -> bytes:
    """A Tinker ``ForwardBackwardRequest`` as the SDK sends it (protobuf)."""
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    datum = types.Datum(
        model_input=types.ModelInput.from_ints(SEQ[:-1]),
        loss_fn_inputs={"target_tokens": SEQ[1:], "weights": [1.0] * (len(SEQ) - 1)},
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
        model_id=model_id,
        seq_id=seq_id,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def ce_graph() -> tuple[dict, list]:
    from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

    def ce(logprobs, weights):
        return -(logprobs * weights).sum(), {}

    handle = trace_loss(ce, {"logprobs": 1, "weights": 1}, "session")
    return encode_graph(handle).model_dump(), [i.model_dump() for i in handle.inputs]


@dataclass
class World:
    server: Any
    storage: Path
    ids: dict[str, Any] = field(default_factory=dict)

    def http(self, who: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {KEYS[who]}"} if who else {}
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.server.app, raise_app_exceptions=False),
            base_url="http://test",
            headers=headers,
            timeout=30.0,
        )


async def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, (str(response.request.url), response.text[:300])
    return response.json()


async def done(http: httpx.AsyncClient, reply: dict) -> dict:
    """The result of a Tinker future (``reply`` holds its ``request_id``)."""
    for _ in range(400):
        response = await http.post(
            "/api/v1/retrieve_future", json={"request_id": reply["request_id"]}
        )
        if response.headers.get("content-type", "").startswith("application/x-protobuf"):
            return {"protobuf": response.content}
        got = await _ok(response)
        if got.get("type") != "try_again":
            assert "error" not in got, got
            return got
        await asyncio.sleep(0.01)
    raise AssertionError(f"future {reply} never finished")


async def _native(world: World, who: str, http: httpx.AsyncClient, name: str) -> None:
    ids, model = world.ids, PREFIXES["model"]
    sid = (await _ok(await http.post("/api/v1/create_session", json={"tags": []})))["session_id"]
    added = await _ok(
        await http.post(
            f"{model}/add_adapter_to_model",
            json={"adapter_name": name, "config": {"r": 4, "lora_alpha": 8}, "session_id": sid},
        )
    )
    ids[f"{who}_session"], ids[f"{who}_run"] = sid, added["result"]["training_run_id"]
    body = {"adapter_name": name, "optimizer": "Adam", "lr": 1e-2}
    await _ok(await http.post(f"{model}/set_optimizer", json=body))
    fb = {"adapter_name": name, "inputs": features()}
    await _ok(await http.post(f"{model}/forward_backward", json=fb))
    await _ok(await http.post(f"{model}/clip_grad_and_step", json={"adapter_name": name}))
    save = {"adapter_name": name, "name": f"{who}-ck", "save_optimizer": True}
    ids[f"{who}_ckpt"] = (await _ok(await http.post(f"{model}/save", json=save)))["result"]["path"]
    # Gradients pending mid-accumulation: bob must not be able to touch them either.
    await _ok(await http.post(f"{model}/forward_backward", json=fb))


async def _tinker(world: World, who: str, http: httpx.AsyncClient) -> None:
    ids, sid = world.ids, world.ids[f"{who}_session"]
    created = await http.post(
        "/api/v1/create_model",
        json={"session_id": sid, "model_seq_id": 0, "base_model": BASE, "lora_config": {"rank": 4}},
    )
    model_id = (await done(http, await _ok(created)))["model_id"]
    ids[f"{who}_model"] = model_id
    if who != "alice":
        return
    proto = {"content-type": "application/x-protobuf"}
    fb = await http.post("/api/v1/forward_backward", content=fb_proto(model_id, 1), headers=proto)
    await done(http, await _ok(fb))
    step = {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": 1e-3}}
    await done(http, await _ok(await http.post("/api/v1/optim_step", json=step)))
    save = {"model_id": model_id, "seq_id": 3, "path": "tk-state"}
    ids["alice_state"] = (
        await done(http, await _ok(await http.post("/api/v1/save_weights", json=save)))
    )["path"]
    save = {"model_id": model_id, "seq_id": 4, "path": "tk-sampler"}
    reply = await http.post("/api/v1/save_weights_for_sampler", json=save)
    ids["alice_sampler_path"] = (await done(http, await _ok(reply)))["path"]
    save = {"model_id": model_id, "seq_id": 5, "path": "tk-ext"}
    reply = await http.post("/api/v1/save_weights_external", json=save)
    ids["alice_external"] = (await done(http, await _ok(reply)))["path"]
    body = {"session_id": sid, "sampling_session_seq_id": 0, "model_path": ids["alice_state"]}
    reply = await http.post("/api/v1/create_sampling_session", json=body)
    ids["alice_sampler"] = (await _ok(reply))["sampling_session_id"]
    ids["alice_future"] = (await _ok(await http.post("/api/v1/asample", json=sample_body(ids))))[
        "request_id"
    ]
    await done(http, {"request_id": ids["alice_future"]})
    graph, inputs = ce_graph()
    body = {"session_id": sid, "custom_loss_seq_id": 0, "name": "ce", "graph": graph}
    reply = await http.post("/api/v1/create_custom_loss", json={**body, "inputs": inputs})
    ids["alice_loss"] = (await done(http, await _ok(reply)))["loss_id"]
    trace = await _ok(await http.get(f"/api/v1/sessions/{sid}/trace_export"))
    ids["alice_trace_token"] = urlsplit(trace["url"]).path.rsplit("/", 1)[1]
    run, _, rest = ids["alice_state"].split("://", 1)[1].partition("/")
    archive = await _ok(await http.get(f"/api/v1/training_runs/{run}/checkpoints/{rest}/archive"))
    ids["alice_archive"] = urlsplit(archive["url"]).path.split("/api/v1", 1)[1]
    run, _, rest = ids["alice_external"].split("://", 1)[1].partition("/")
    kind, name = rest.split("/")
    urls = await _ok(
        await http.get(
            f"/api/v1/training_runs/{run}/checkpoints/{kind}/{name}/external_weights_urls"
        )
    )
    ids["alice_download"] = urlsplit(next(iter(urls["urls"].values()))).path.split("/api/v1", 1)[1]


def sample_body(ids: dict, sid: str | None = None) -> dict:
    return {
        "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": SEQ[:4]}]},
        "sampling_params": {"max_tokens": 2, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
        "sampling_session_id": sid or ids["alice_sampler"],
        "seq_id": 1,
    }


async def build(root: Path) -> World:
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    server = build_local_server(parse_config(server_config(root)), store=MemoryStore("iso:"))
    world = World(server, root / "storage")
    for who, name in (("alice", "nat"), ("bob", "mine")):
        async with world.http(who) as http:
            await _native(world, who, http, name)
            await _tinker(world, who, http)
    async with world.http("alice") as http:
        meta = {"dataset_meta": {"data": [{"text": "a"}, {"text": "b"}]}}
        reply = await _ok(await http.post(f"{PREFIXES['processor']}/create_dataset", json=meta))
        world.ids["alice_dataset"] = reply["result"]["dataset"]
    world.ids["alice_native"] = "nat"
    return world


# ----------------------------------------------------------------------------- state
def _digest(tensor: Any) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(-1).numpy().tobytes()).hexdigest()


def _tenant_state(tenant: Any) -> dict:
    state = {
        "weights": [_digest(p) for p in tenant.params],
        "grads": [None if p.grad is None else _digest(p.grad) for p in tenant.params],
        "configs": repr((tenant.optimizer_config, tenant.loss_config, tenant.template_name)),
        "progress": (tenant.cur_step, tenant.micro_step, tenant.consumed_train_samples),
    }
    if tenant.optimizer is not None:
        opt = tenant.optimizer.state_dict()
        state["optimizer"] = repr(
            {k: {n: _digest(v) if hasattr(v, "numpy") else v for n, v in s.items()}
             for k, s in opt["state"].items()}
        )  # fmt: skip
    return state


def tinker_api(world: World) -> Any:
    gateway = next(m.app for m in world.server.app.routes if m.path == PREFIXES["gateway"])
    for route in gateway.routes:
        api = getattr(getattr(route, "original_router", None), "tinker_api", None)
        if api is not None:
            return api
    raise AssertionError("no Tinker router on the gateway")


def processor(world: World) -> Any:
    return next(m.app for m in world.server.app.routes if m.path == PREFIXES["processor"])


def snapshot(world: World) -> dict:
    """Everything of alice's (and everything shared) a request could change; bob's own records
    are left out (his refused calls may add audit events or failed futures of his own)."""
    state = world.server.context.state
    state.flush_usage()  # buffered usage counts: written by any reader, the same values
    writer = world.server.services["model"].history.writer
    assert writer.flush()  # alice's training history, written in the background after her steps
    bob_lanes = (world.ids.get("bob_session") or BOB) + ":"
    store = {
        k: v
        for k, v in state.store.scan("")
        if BOB not in k
        and not k.startswith("instance/")  # replica liveness, no tenant's state
        and not (isinstance(v, dict) and v.get("owner") == BOB)
    }
    files = {
        str(p.relative_to(world.storage)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(world.storage.rglob("*"))
        if p.is_file() and BOB not in str(p)
    }
    service = world.server.services["model"]
    entries = {k: repr(v) for k, v in service.adapters.items() if v.owner != BOB}
    tenants = {k: _tenant_state(service.model.tenants[k]) for k in entries}
    api = tinker_api(world)
    lanes = {k: v.last_seq for k, v in api.futures._lanes.items() if not k.startswith(bob_lanes)}
    datasets = {
        owner: {h: len(d) for h, d in handles.items()}
        for owner, handles in processor(world).state.service._datasets.items()
        if owner != BOB
    }
    losses = {o: sorted(ls) for o, ls in getattr(api, "custom_losses", None)._losses.items()}
    templates = {o: repr(t) for o, t in world.server.services["sampler"].templates.items()}
    return {
        "store": store,
        "files": files,
        "adapters": entries,
        "tenants": tenants,
        "lanes": lanes,
        "datasets": datasets,
        "custom_losses": {o: v for o, v in losses.items() if o != BOB},
        "sampler_templates": {o: v for o, v in templates.items() if o != BOB},
    }


def changes(before: dict, after: dict) -> list[str]:
    out = []
    for part, old in before.items():
        new = after[part]
        out += [f"{part}:{k}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return out
