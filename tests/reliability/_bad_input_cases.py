"""One tiny in-process server with known state, a state snapshot, and the bad-input oracle.

The world (built once per process, :func:`world`): the gateway with the Tinker API, the model
(tiny qwen3, transformers), the sampler and the processor, behind one ASGI app; tenant alice has
a session, a trained native adapter with optimizer state, a saved checkpoint, a Tinker training
run and a sampling session; bob has his own session, adapter and checkpoint (the cross-tenant
targets). :func:`snapshot` is everything a request could change: every key of the state store,
every file under storage (bytes), and every adapter's weights, gradients and optimizer state.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from twinkle.server.testing import KEYS, config_dict  # noqa: E402

BASE = "tiny/qwen3"
MODEL = f"/api/v1/model/{BASE}"
SAMPLER = f"/api/v1/sampler/{BASE}"
PROCESSOR = "/api/v1/processor"
REQUEST_TIMEOUT_S = 20.0
# What Ray's wrapper of a remote error, or a traceback, would leak into a body.
LEAKS = ("pid=", "actor_id", "ray::", "Traceback", 'File "/')


@dataclass
class World:
    server: Any
    storage: Path
    ids: dict[str, str] = field(default_factory=dict)


def _config(root: Path) -> dict:
    config = config_dict(model_id="tiny://qwen3", sampler=True, max_loras=8)
    config["applications"][0]["args"]["server_config"]["per_token_model_limit"] = 8
    config["applications"].append(
        {
            "name": "processor",
            "route_prefix": PROCESSOR,
            "import_path": "processor",
            "args": {},
        }
    )
    config["storage"] = {"root": str(root / "storage")}
    return config


def features(rows: int = 2, seq: int = 10) -> list[dict]:
    return [
        {"input_ids": [10 + r + t for t in range(seq)], "labels": [-100] * 3 + [20] * (seq - 3)}
        for r in range(rows)
    ]


def client(world: World, who: str | None = "alice", **headers: str) -> httpx.AsyncClient:
    if who is not None:
        headers.setdefault("Authorization", f"Bearer {KEYS[who]}")
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=world.server.app, raise_app_exceptions=False),
        base_url="http://test",
        headers=headers,
        timeout=REQUEST_TIMEOUT_S,
    )


async def _ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, (response.request.url, response.text)
    return response.json()


async def _future(http: httpx.AsyncClient, reply: dict) -> dict:
    for _ in range(200):
        got = await _ok(await http.post("/api/v1/retrieve_future", json=reply))
        if got.get("type") != "try_again":
            return got
    raise AssertionError(f"future {reply} never finished")


async def _tenant(world: World, who: str) -> None:
    ids = world.ids
    async with client(world, who) as http:
        sid = (await _ok(await http.post("/api/v1/create_session", json={"tags": ["x"]})))[
            "session_id"
        ]
        ids[f"{who}_session"] = sid
        added = await _ok(
            await http.post(
                f"{MODEL}/add_adapter_to_model",
                json={"adapter_name": "default", "config": {"r": 4, "lora_alpha": 8}},
            )
        )
        ids[f"{who}_run"] = added["result"]["training_run_id"]
        await _ok(
            await http.post(
                f"{MODEL}/set_optimizer",
                json={"adapter_name": "default", "optimizer": "Adam", "lr": 1e-2},
            )
        )
        body = {"adapter_name": "default", "inputs": features()}
        await _ok(await http.post(f"{MODEL}/forward_backward", json=body))
        await _ok(await http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "default"}))
        saved = await _ok(
            await http.post(
                f"{MODEL}/save",
                json={"adapter_name": "default", "name": "ck-1", "save_optimizer": True},
            )
        )
        ids[f"{who}_ckpt"] = saved["result"]["path"]
        if who != "alice":
            return
        created = await http.post(
            "/api/v1/create_model",
            json={
                "session_id": sid,
                "model_seq_id": 0,
                "base_model": BASE,
                "lora_config": {"rank": 4},
            },
        )
        ids["alice_model"] = (await _future(http, await _ok(created)))["model_id"]
        sampling = await http.post(
            "/api/v1/create_sampling_session",
            json={"session_id": sid, "sampling_session_seq_id": 0, "base_model": BASE},
        )
        ids["alice_sampler"] = (await _ok(sampling))["sampling_session_id"]


@functools.cache
def world() -> World:
    """The shared server (built once: building the tiny model costs seconds)."""
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    root = Path(tempfile.mkdtemp(prefix="twinkle-badinput-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    server = build_local_server(parse_config(_config(root)), store=MemoryStore("bi:"))
    built = World(server, root / "storage")

    async def setup() -> None:
        await _tenant(built, "alice")
        await _tenant(built, "bob")

    asyncio.run(setup())
    return built


def _tensor_digest(tensor: Any) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(-1).numpy().tobytes()).hexdigest()


def _model_state(model: Any) -> dict:
    out: dict[str, Any] = {}
    for name, tenant in getattr(model, "tenants", {}).items():
        params = [p for p in tenant.params]
        entry = {
            "weights": [_tensor_digest(p) for p in params],
            "grads": [None if p.grad is None else _tensor_digest(p.grad) for p in params],
            "optimizer_config": repr(tenant.optimizer_config),
            "loss_config": repr(tenant.loss_config),
        }
        if tenant.optimizer is not None:
            state = tenant.optimizer.state_dict()
            entry["optimizer"] = repr(
                {
                    k: {n: _tensor_digest(v) if hasattr(v, "numpy") else v for n, v in s.items()}
                    for k, s in state["state"].items()
                }
            )
        out[name] = entry
    return out


def snapshot(w: World) -> dict:
    """State store keys and values, storage file bytes, and every adapter's tensors."""
    store = w.server.context.state.store
    for service in w.server.services.values():  # training history written in the background
        writer = getattr(getattr(service, "history", None), "writer", None)
        assert writer is None or writer.flush()
    files = {
        str(p.relative_to(w.storage)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(w.storage.rglob("*"))
        if p.is_file()
    }
    models = {
        name: _model_state(service.model)
        for name, service in w.server.services.items()
        if hasattr(service, "model")
    }
    datasets = {owner: sorted(handles) for owner, handles in processor_service(w)._datasets.items()}
    return {
        "store": dict(store.scan("")),
        "files": files,
        "models": models,
        "datasets": datasets,
    }


def processor_service(w: World) -> Any:
    mount = next(r for r in w.server.app.routes if r.path == PROCESSOR)
    return mount.app.state.service


def diff(before: dict, after: dict) -> list[str]:
    """What changed, by key (empty when nothing did)."""
    changes = []
    for part in ("store", "files", "models", "datasets"):
        old, new = before[part], after[part]
        changes += [f"{part}: {k}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return changes


@dataclass
class Case:
    """One bad request and what its 4xx body must name (``mentions``, any of, case-insensitive).

    ``status`` narrows the 4xx when the status itself is the contract (404 for another tenant's
    record, 413 for an oversized body).
    """

    name: str
    method: str
    url: str
    mentions: tuple[str, ...]
    json: Any = None
    content: bytes | Callable[[dict], bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    who: str | None = "alice"
    status: int | None = None


@dataclass
class Outcome:
    case: Case
    status: int
    body: str
    problems: list[str]


async def check(w: World, case: Case, ids: dict[str, str]) -> Outcome:
    """Send ``case`` and judge it: a 4xx in time, a JSON body naming the field, no leak, and
    no change to any state."""
    before = snapshot(w)
    url = case.url.format(**ids)
    kwargs: dict[str, Any] = {"headers": case.headers}
    if callable(case.content):  # a protobuf body is built with the world's ids
        kwargs["content"] = case.content(ids)
    elif case.content is not None:
        content = case.content
        for key, value in ids.items():  # raw bodies name the world's ids as {alice_run}
            content = content.replace(b"{%s}" % key.encode(), value.encode())
        kwargs["content"] = content
    elif case.json is not None:
        # ensure_ascii: lone surrogates travel as \\ud800 escapes (valid JSON text)
        kwargs["content"] = json.dumps(_fill(case.json, ids), allow_nan=False).encode()
        kwargs["headers"] = {"content-type": "application/json", **case.headers}
    problems = []
    async with client(w, case.who) as http:
        try:
            response = await asyncio.wait_for(
                http.request(case.method, url, **kwargs), REQUEST_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            return Outcome(case, 0, "", [f"no answer within {REQUEST_TIMEOUT_S} s"])
    status, text = response.status_code, response.text
    if not 400 <= status < 500:
        problems.append(f"status {status}")
    if case.status is not None and status != case.status:
        problems.append(f"status {status}, wanted {case.status}")
    problems += judge_body(response, case.mentions)
    changed = diff(before, snapshot(w))
    if changed:
        problems.append(f"state changed: {changed[:5]}")
    return Outcome(case, status, text[:300], problems)


def judge_body(response: httpx.Response, mentions: tuple[str, ...]) -> list[str]:
    """A 4xx JSON error body whose message names one of ``mentions`` and leaks nothing."""
    try:
        body = response.json()
    except ValueError:
        return [f"body is not JSON: {response.text[:100]!r}"]
    message = str(body.get("error") or body.get("detail") or "") if isinstance(body, dict) else ""
    problems = []
    if not message:
        problems.append(f"no error message in {body!r:.100}")
    elif mentions and not any(m.lower() in message.lower() for m in mentions):
        problems.append(f"message {message[:160]!r} names none of {mentions}")
    problems += [f"body leaks {leak!r}" for leak in LEAKS if leak in response.text]
    return problems


def _fill(value: Any, ids: dict[str, str]) -> Any:
    """``{alice_run}``-style placeholders in string values -> the world's ids."""
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return ids.get(value[1:-1], value)
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    return value
