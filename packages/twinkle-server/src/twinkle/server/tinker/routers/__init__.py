"""The Tinker-compatible API (``/api/v1``): what the unmodified ``tinker`` SDK calls.

One module per endpoint group, each a router of module-level handlers: a handler takes the
caller (:data:`._deps.Owner`), this server's :class:`~twinkle.server.tinker.api.TinkerApi`
(bound to the request, :mod:`twinkle.server.web.bind`) and
its request as the SDK's own type (:func:`._deps.sdk_body`), and calls the service function of
its group (:mod:`..training`, :mod:`..sampling`, :mod:`..weights`, ...). Protobuf bodies are
decoded by :mod:`..wire`. The shared session, run and checkpoint endpoints are the gateway's
(``routes_common``).
"""

from __future__ import annotations

from fastapi import APIRouter

from twinkle.server.context import ServerContext
from twinkle.server.gateway.backends import Backends
from twinkle.server.tinker.api import TinkerApi
from twinkle.server.tinker.routers import (
    admin,
    client,
    futures,
    sampling,
    sessions,
    training,
    weights,
    weights_external,
)
from twinkle.server.web.bind import bind_router

GROUPS = (client, training, weights, weights_external, sampling, futures, sessions, admin)


def create_tinker_router(ctx: ServerContext, backends: Backends) -> APIRouter:
    """Every Tinker endpoint group over one :class:`TinkerApi` of ``ctx`` and ``backends``."""
    api = TinkerApi(ctx, backends)
    groups = APIRouter()
    for group in GROUPS:
        groups.include_router(group.router)
    router = bind_router(groups, tinker_api=api)
    router.tinker_api = api  # type: ignore[attr-defined]  # for tests and benchmarks
    return router


__all__ = ["create_tinker_router"]
