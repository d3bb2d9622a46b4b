"""State and helpers shared by the Tinker routes: the per-server ``TinkerApi`` object."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from twinkle.server.context import ServerContext
from twinkle.server.errors import BadRequest, PayloadTooLarge
from twinkle.server.gateway.backends import Backends
from twinkle.server.tinker.futures import TinkerFutures, body_digest
from twinkle.server.tinker.models import checkpoint_facts
from twinkle.server.web import read_json

LONG_POLL_S = 25.0
EPHEMERAL_TTL_S = 24 * 3600.0
CLIENT_CONFIG = {
    "use_pyqwest_transport": False,
    "pjwt_auth_enabled": True,
    "parallel_fwdbwd_chunks": True,
    "proto_compress_fwdbwd": True,
    "sample_use_retrieve_futures": True,
    "custom_loss_server_side": True,
    "sample_join_sampling_session": True,
}


@dataclass
class SequencedCall:
    """A JSON Tinker call that carries ``model_id`` and ``seq_id`` (ordered, deduplicated)."""

    kind: str
    owner: str
    body: dict[str, Any]
    model_id: str | None
    seq_id: Any
    keys: list[tuple]
    existing: str | None  # request id of an earlier identical submission


class TinkerApi:
    """The state the routes share: server context, backends, futures."""

    def __init__(self, ctx: ServerContext, backends: Backends) -> None:
        self.ctx, self.backends, self.state = ctx, backends, ctx.state
        self.futures = TinkerFutures(ctx.state)
        self.max_bytes = ctx.server_args.max_request_bytes

    # -- helpers -------------------------------------------------------------------------------
    def run_of(self, owner: str, model_id: Any):
        if not isinstance(model_id, str) or not model_id:
            raise BadRequest("missing model_id")
        return self.state.get_run(owner, model_id)

    def dedupe_keys(self, request: Request, *parts: Any) -> list[tuple]:
        keys = [("call", *parts)] if all(p is not None for p in parts[1:]) else []
        idem = request.headers.get("x-idempotency-key")
        return ([("idem", idem)] if idem else []) + keys

    async def open_call(self, request: Request, kind: str) -> SequencedCall:
        """Authenticate, read the JSON body and look up an earlier submission of the same call."""
        owner = self.ctx.authenticate(request.headers)
        body = await read_json(request, self.max_bytes)
        model_id, seq_id = body.get("model_id"), body.get("seq_id")
        if model_id is not None and not isinstance(model_id, str):
            raise BadRequest(f"model_id must be a string, got {type(model_id).__name__}")
        if seq_id is not None and (not isinstance(seq_id, int) or isinstance(seq_id, bool)):
            raise BadRequest(f"seq_id must be an integer, got {type(seq_id).__name__}")
        keys = self.dedupe_keys(request, kind, model_id, seq_id, request_digest(body))
        return SequencedCall(
            kind, owner, body, model_id, seq_id, keys, self.futures.find(owner, keys)
        )

    async def sequenced(self, call: SequencedCall, prepare: Callable[[], Any]) -> dict[str, Any]:
        """The one path of every sequenced call: an identical earlier submission answers with
        its request id; else ``prepare()`` validates the call NOW (a refusal still uses up the
        seq_id, so later calls do not wait for it) and returns what runs later, in seq_id order
        (``prepare`` may be a coroutine function).
        """
        if call.existing:
            return self.submitted(call.existing, call.model_id)
        try:
            run = prepare()
            if inspect.isawaitable(run):
                run = await run
        except Exception as exc:
            await self.refuse(call.model_id, call.seq_id, exc, call.owner)
        return self.submit_call(call, run)

    def submit_call(self, call: SequencedCall, run: Any) -> dict[str, Any]:
        """Queue ``run`` as ``call``'s future, in its model's seq_id order."""
        rid = self.futures.submit(
            call.owner, call.kind, run, model_id=call.model_id, seq_id=call.seq_id, dedupe=call.keys
        )
        return self.submitted(rid, call.model_id)

    def submitted(self, rid: str, model_id: str | None = None, **extra: Any) -> dict[str, Any]:
        return {"request_id": rid, **({"model_id": model_id} if model_id else {}), **extra}

    async def refuse(self, model_id: str | None, seq_id: Any, exc: Exception, owner: str) -> None:
        """A call refused before it ran still uses up its seq_id (later ones must not wait for it).

        Only in the caller's own model's lane: another key naming a model id it does not own
        must neither move that model's calls out of order nor add a lane (it gets a 404).
        """
        if model_id and isinstance(seq_id, int) and self._owns(owner, model_id):
            await self.futures.lane(model_id).skip(seq_id)
        raise exc

    def _owns(self, owner: str, model_id: Any) -> bool:
        try:
            self.run_of(owner, model_id)
        except Exception:  # noqa: BLE001 - unknown, malformed or another key's: not ours
            return False
        return True

    async def read_body(self, request: Request) -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > self.max_bytes:
                raise PayloadTooLarge(f"request body is over the limit of {self.max_bytes} bytes")
        return bytes(body)

    def sampler_target(self, owner: str, body: dict[str, Any]) -> tuple[str, str | None]:
        """(base model, twinkle:// adapter path or None) of a sampling request."""
        sid = body.get("sampling_session_id")
        if sid is not None and not isinstance(sid, str):
            raise BadRequest(f"sampling_session_id must be a string, got {sid!r}")
        if sid:
            record = self.state.get_sampling_session(owner, sid)
            return record.base_model, record.model_path
        if body.get("model_path"):
            facts = checkpoint_facts(self.state, owner, body["model_path"])
            return facts.base_model, facts.path
        if body.get("base_model"):
            return body["base_model"], None
        raise BadRequest("asample needs sampling_session_id, model_path or base_model")

    async def save(self, owner: str, model_id: str, name: str, kind: str, ttl: Any) -> str:
        """Save ``model_id``'s adapter as checkpoint ``kind/name``, expiring in ``ttl`` seconds
        (``None``: the server's default) set in the same record; returns its path. The route
        has validated ``name`` (snapshots use the reserved prefix, which tenants may not)."""
        return (
            await self.backends.model(self.run_of(owner, model_id).base_model).call(
                owner,
                "save_checkpoint",
                {
                    "adapter_name": model_id,
                    "name": name,
                    "kind": "sampler" if kind == "sampler_weights" else kind,
                    "save_optimizer": kind == "weights",
                    "ttl_seconds": None if ttl is None else float(ttl),
                },
            )
        )["path"]

    async def create_adapter(
        self,
        owner: str,
        base_model: str,
        model_id: str,
        session_id: str,
        seq: int,
        config: dict[str, Any],
        user_metadata: Any,
    ) -> None:
        await self.backends.model(base_model).call(
            owner,
            "add_adapter_to_model",
            {
                "adapter_name": model_id,
                "config": config,
                "training_run_id": model_id,
                "session_id": session_id,
                "model_seq_id": seq,
                "user_metadata": user_metadata or {},
            },
        )


def request_digest(body: dict) -> str:
    return body_digest(json.dumps(body, sort_keys=True, default=str))
