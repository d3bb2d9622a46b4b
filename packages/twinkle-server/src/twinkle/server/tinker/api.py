"""The Tinker service's shared state and its sequenced-call path: the per-server ``TinkerApi``.

Plain Python over the server context and the backends (no web types): the handlers of
:mod:`.routers` hand it the caller and the SDK's request objects.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twinkle.server.context import ServerContext
from twinkle.server.gateway.backends import Backends
from twinkle.server.tinker.futures import TinkerFutures, body_digest
from twinkle.server.tinker.models import checkpoint_facts
from twinkle.server.web.errors import BadRequest

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
    """A Tinker call that carries ``model_id`` and ``seq_id`` (ordered, deduplicated)."""

    kind: str
    owner: str
    model_id: str | None
    seq_id: int | None
    keys: list[tuple]
    existing: str | None  # request id of an earlier identical submission


class TinkerApi:
    """The state the routes share: server context, backends, futures."""

    def __init__(self, ctx: ServerContext, backends: Backends) -> None:
        self.ctx, self.backends, self.state = ctx, backends, ctx.state
        self.futures = TinkerFutures(ctx.state)
        self.max_bytes = ctx.server_args.max_request_bytes

    # -- helpers -------------------------------------------------------------------------------
    def run_of(self, owner: str, model_id: str | None):
        if not model_id:
            raise BadRequest("missing model_id")
        return self.state.get_run(owner, model_id)

    def dedupe_keys(self, idem: str | None, *parts: Any) -> list[tuple]:
        """The keys an earlier identical submission is found by: the client's idempotency key
        (``X-Idempotency-Key``), and ``parts`` when none of them after the kind is ``None``."""
        keys = [("call", *parts)] if all(p is not None for p in parts[1:]) else []
        return ([("idem", idem)] if idem else []) + keys

    def open_call(self, owner: str, kind: str, body: Any, idem: str | None) -> SequencedCall:
        """A sequenced call of ``body`` (an SDK request with ``model_id`` and ``seq_id``) and
        the request id of an earlier identical submission, if any."""
        model_id, seq_id = body.model_id, body.seq_id
        digest = request_digest(body.model_dump(mode="json"))
        keys = self.dedupe_keys(idem, kind, model_id, seq_id, digest)
        return SequencedCall(kind, owner, model_id, seq_id, keys, self.futures.find(owner, keys))

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

    async def refuse(
        self, model_id: str | None, seq_id: int | None, exc: Exception, owner: str
    ) -> None:
        """A call refused before it ran still uses up its seq_id (later ones must not wait for it).

        Only in the caller's own model's lane: another key naming a model id it does not own
        must neither move that model's calls out of order nor add a lane (it gets a 404).
        """
        if model_id and seq_id is not None and self._owns(owner, model_id):
            await self.futures.lane(model_id).skip(seq_id)
        raise exc

    def _owns(self, owner: str, model_id: str) -> bool:
        try:
            self.run_of(owner, model_id)
        except Exception:  # noqa: BLE001 - unknown, malformed or another key's: not ours
            return False
        return True

    def sampler_target(self, owner: str, body: Any) -> tuple[str, str | None]:
        """(base model, twinkle:// adapter path or None) of a ``SampleRequest``."""
        if body.sampling_session_id:
            record = self.state.get_sampling_session(owner, body.sampling_session_id)
            return record.base_model, record.model_path
        if body.model_path:
            facts = checkpoint_facts(self.state, owner, body.model_path)
            return facts.base_model, facts.path
        if body.base_model:
            return body.base_model, None
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
