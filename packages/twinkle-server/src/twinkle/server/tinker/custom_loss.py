"""Server-side custom losses (``custom_loss_server_side``): ``create_custom_loss`` stores a
checked graph, ``forward_backward`` with ``loss_fn="custom"`` and ``loss_fn_config
{"loss_id"}`` runs it inside the (fused) training step.

The graph is plain data (the SDK's ``CustomLossGraph``); :mod:`twinkle.loss.fx_graph` checks
it against the allow-list here, so a refused op is a 400 at creation, and again where the loss
runs. Stored losses live in this server process, per API key and session.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tinker import types

from twinkle.errors import InvalidArgumentError
from twinkle.loss.fx_graph import parse_graph
from twinkle.server.tinker import convert
from twinkle.server.tinker.wire import WireDatum, WireForwardBackward
from twinkle.server.web.errors import BadRequest

MAX_LOSSES_PER_KEY = 256


@dataclass(frozen=True)
class StoredLoss:
    """A created loss: the graph and inputs as the SDK sent them (already checked)."""

    loss_id: str
    session_id: str
    name: str
    inputs: list[dict[str, Any]]
    graph: dict[str, Any]


class CustomLossStore:
    """The losses each API key created, by ``loss_id``."""

    def __init__(self) -> None:
        self._losses: dict[str, dict[str, StoredLoss]] = {}

    def add(self, owner: str, loss: StoredLoss) -> None:
        losses = self._losses.setdefault(owner, {})
        if loss.loss_id not in losses and len(losses) >= MAX_LOSSES_PER_KEY:
            raise BadRequest(f"this API key already created {MAX_LOSSES_PER_KEY} custom losses")
        losses[loss.loss_id] = loss

    def get(self, owner: str, loss_id: Any) -> StoredLoss:
        loss = self._losses.get(owner, {}).get(loss_id) if isinstance(loss_id, str) else None
        if loss is None:
            raise BadRequest(
                f"unknown custom loss_id {loss_id!r}: create it with create_custom_loss first"
            )
        return loss


def store_of(api: Any) -> CustomLossStore:
    store = getattr(api, "custom_losses", None)
    if store is None:
        store = api.custom_losses = CustomLossStore()
    return store


def create(api: Any, owner: str, body: types.CreateCustomLossRequest, idem: str | None) -> dict:
    """Check the graph now (400 naming a refused op), store it, answer with a future whose
    result is ``{loss_id}``."""
    api.state.get_session(owner, body.session_id)
    graph = body.graph.model_dump(exclude_unset=True)
    inputs = [item.model_dump() for item in body.inputs]
    try:
        parse_graph(graph, inputs)
    except InvalidArgumentError as exc:
        raise BadRequest(f"create_custom_loss {body.name!r}: {exc}") from None
    loss_id = f"{body.session_id}:loss:{body.custom_loss_seq_id}"
    loss = StoredLoss(loss_id, body.session_id, body.name, inputs, graph)
    keys = api.dedupe_keys(idem, "create_custom_loss", loss.loss_id)
    if rid := api.futures.find(owner, keys):
        return api.submitted(rid)
    store_of(api).add(owner, loss)

    async def run() -> dict:
        return {"loss_id": loss.loss_id, "type": "create_custom_loss"}

    return api.submitted(api.futures.submit(owner, "create_custom_loss", run, dedupe=keys))


def features_and_loss(
    api: Any, owner: str, run: Any, msg: WireForwardBackward, vocab_size: int | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A ``custom`` forward_backward's model features and its loss spec (graph + inputs)."""
    unknown = sorted(set(msg.loss_fn_config) - {"loss_id"})
    if unknown:
        raise BadRequest(f"loss_fn 'custom' takes loss_fn_config ['loss_id'], got {unknown}")
    loss = store_of(api).get(owner, msg.loss_fn_config.get("loss_id"))
    if loss.session_id != getattr(run, "session_id", loss.session_id):
        raise BadRequest(f"custom loss {loss.name!r} belongs to another session")
    ranks = [(item["name"], item["rank"]) for item in loss.inputs[1:]]
    targets_only = [
        WireDatum(d.tokens, {"target_tokens": d.inputs["target_tokens"]})
        for d in msg.data
        if "target_tokens" in d.inputs
    ]
    if len(targets_only) != len(msg.data):
        raise BadRequest("forward_backward: every datum needs loss_fn_inputs['target_tokens']")
    features = convert.datums_to_features(targets_only, "cross_entropy", vocab_size)
    values = [_datum_values(i, datum, ranks, loss.name) for i, datum in enumerate(msg.data)]
    return features, {
        "name": "custom",
        "graph": loss.graph,
        "inputs": loss.inputs,
        "values": values,
    }


def _datum_values(
    i: int, datum: WireDatum, ranks: list[tuple[str, int]], loss_name: str
) -> list[dict[str, Any]]:
    out = []
    for name, rank in ranks:
        if name not in datum.inputs:
            raise BadRequest(
                f"data[{i}] has no loss_fn_inputs[{name!r}], which {loss_name!r} takes"
            )
        values = datum.inputs[name]
        shape = list(datum.shapes.get(name) or [values.size])
        if values.dtype.kind == "f" and not all(math.isfinite(v) for v in values.tolist()):
            raise BadRequest(f"data[{i}]: loss_fn_inputs[{name!r}] has non-finite values")
        if (rank == 0 and values.size != 1) or (rank and len(shape) not in (rank, 0)):
            raise BadRequest(
                f"data[{i}]: loss_fn_inputs[{name!r}] has shape {shape}, but {loss_name!r} "
                f"declared it with rank {rank}"
            )
        out.append({"data": values.tolist(), "shape": shape})
    return out


def custom_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The ``custom/<name>:sum|mean`` metrics of a custom loss's result."""
    return {
        k: float(v) for k, v in (result.get("metrics") or {}).items() if k.startswith("custom/")
    }


__all__ = ["CustomLossStore", "create", "custom_metrics", "features_and_loss"]
