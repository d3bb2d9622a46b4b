"""Unknown request fields from a newer SDK: ignored, and logged once per endpoint and field name.

The Tinker routes read their JSON bodies leniently (a field they do not know is never an error),
so that a client newer than the server keeps working. This router dependency compares each JSON
body with the installed SDK's request type of that endpoint and logs what it does not know, so
an operator sees what a newer client sends. Twinkle's native API keeps its strict models.
"""

from __future__ import annotations

import json
import logging

from fastapi import Request
from tinker import types

logger = logging.getLogger("twinkle.server.tinker")

REQUEST_TYPES = {
    "client/config": types.ClientConfigRequest,
    "create_session": types.CreateSessionRequest,
    "session_heartbeat": types.SessionHeartbeatRequest,
    "create_model": types.CreateModelRequest,
    "get_info": types.GetInfoRequest,
    "optim_step": types.OptimStepRequest,
    "save_weights": types.SaveWeightsRequest,
    "save_weights_for_sampler": types.SaveWeightsForSamplerRequest,
    "save_weights_external": types.SaveWeightsExternalRequest,
    "load_weights": types.LoadWeightsRequest,
    "copy_weights": types.CopyWeightsRequest,
    "create_sampling_session": types.CreateSamplingSessionRequest,
    "join_sampling_session": types.JoinSamplingSessionRequest,
    "asample": types.SampleRequest,
    "retrieve_future": types.FutureRetrieveRequest,
    "retrieve_futures": types.FuturesRetrieveRequest,
    "unload_model": types.UnloadModelRequest,
    "create_custom_loss": types.CreateCustomLossRequest,
    "sessions/search": types.SessionSearchRequest,
    "telemetry": types.TelemetrySendRequest,
}
INSPECT_MAX_BYTES = 1 << 20  # larger bodies are not parsed twice
PREFIX = "/api/v1/"

_known = {
    name: {key for f_name, f in model.model_fields.items() for key in (f_name, f.alias) if key}
    for name, model in REQUEST_TYPES.items()
}
_logged: set[tuple[str, str]] = set()


def unknown_fields(endpoint: str, body: dict) -> list[str]:
    """The top-level fields of ``body`` that the SDK's request type of ``endpoint`` lacks."""
    known = _known.get(endpoint)
    return [] if known is None else sorted(k for k in body if k not in known)


def note(endpoint: str, body: dict) -> list[str]:
    """Log each unknown field of ``endpoint`` the first time it is seen; returns them all."""
    found = unknown_fields(endpoint, body)
    for field in found:
        if (endpoint, field) not in _logged:
            _logged.add((endpoint, field))
            logger.warning(
                "ignoring unknown field %r in %s (sent by a newer SDK?); logged once",
                field,
                endpoint,
            )
    return found


async def note_unknown_fields(request: Request) -> None:
    """Router dependency: inspect a small JSON body (Starlette caches it for the route)."""
    route = request.scope.get("route")
    endpoint = getattr(route, "path", request.url.path).removeprefix(PREFIX).lstrip("/")
    length = request.headers.get("content-length", "")
    if (
        endpoint not in _known
        or request.method != "POST"
        or "json" not in request.headers.get("content-type", "json")
        or not length.isdigit()
        or not 0 < int(length) <= INSPECT_MAX_BYTES
    ):
        return
    try:
        body = json.loads(await request.body())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return  # the route answers the malformed body
    if isinstance(body, dict):
        note(endpoint, body)
