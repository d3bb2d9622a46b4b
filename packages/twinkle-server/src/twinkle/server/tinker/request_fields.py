"""The Tinker API's protocol: each JSON endpoint's request type is the SDK's own (``tinker.types``).

:func:`parse` reads a JSON body as its endpoint's type, the one place where unknown fields are
handled: the SDK's request types forbid extra fields, but a client newer than the server may send
fields this server does not know, so they are dropped and logged once per endpoint and field name
(an operator sees what a newer client sends), never refused; so are the fields older SDKs sent
that 0.38 dropped (an ``ImageChunk``'s ``height``). A body that still does not fit the
type is a 400 naming each offending field. Values are not coerced (``"3"`` is no integer), except
where the wire has no type of its own (:data:`COERCED`). Twinkle's native API keeps its own models.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ValidationError
from tinker import types

from twinkle.server.web.errors import BadRequest

logger = logging.getLogger("twinkle.server.tinker")


class LoadWeightsRequest(types.LoadWeightsRequest):
    """The SDK's ``LoadWeightsRequest``; a missing ``optimizer`` loads the weights alone."""

    optimizer: bool = False


REQUEST_TYPES: dict[str, type[BaseModel]] = {
    "client/config": types.ClientConfigRequest,
    "create_session": types.CreateSessionRequest,
    "session_heartbeat": types.SessionHeartbeatRequest,
    "create_model": types.CreateModelRequest,
    "get_info": types.GetInfoRequest,
    "optim_step": types.OptimStepRequest,
    "save_weights": types.SaveWeightsRequest,
    "save_weights_for_sampler": types.SaveWeightsForSamplerRequest,
    "save_weights_external": types.SaveWeightsExternalRequest,
    "load_weights": LoadWeightsRequest,
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
# Endpoints whose type holds values JSON has no type for (the search cursor's datetime is text).
COERCED = frozenset({"sessions/search"})
_MAX_PASSES = 8  # each pass drops the unknown fields one validation found

_logged: set[tuple[str, str]] = set()


def note(endpoint: str, fields: list[str]) -> None:
    """Log each unknown field of ``endpoint`` the first time it is seen."""
    for field in fields:
        if (endpoint, field) not in _logged:
            _logged.add((endpoint, field))
            logger.warning(
                "ignoring unknown field %r in %s (sent by another SDK version?); logged once",
                field,
                endpoint,
            )


def parse(endpoint: str, body: dict[str, Any]) -> Any:
    """``body`` as the SDK's request type of ``endpoint``, its unknown fields dropped and logged.

    Raises:
        BadRequest: The body does not fit the type; the message names each field.
    """
    model, strict = REQUEST_TYPES[endpoint], endpoint not in COERCED
    for _ in range(_MAX_PASSES):
        try:
            return model.model_validate(body, strict=strict)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            unknown = [e["loc"] for e in errors if e["type"] == "extra_forbidden"]
            body, dropped = _without(body, unknown)
            if not dropped:
                raise BadRequest(f"invalid {endpoint} request: {_describe(errors)}") from None
            note(endpoint, dropped)
    raise BadRequest(f"invalid {endpoint} request: too many unknown fields")


def _without(body: dict[str, Any], locs: list[tuple]) -> tuple[dict[str, Any], list[str]]:
    """``body`` less the fields at ``locs`` (copied where changed), and their dotted names.

    A location through a union names the member (``ImageChunk``): it is followed only into the
    member the value says it is (its ``type``), since the other members see every field of
    that value as unknown. A location that does not resolve is left alone.
    """
    dropped = []
    for loc in locs:
        path = _key_path(body, loc)
        if path is None:
            continue
        body = _copy_path(body, path[:-1])
        parent = body
        for part in path[:-1]:
            parent = parent[part]
        del parent[path[-1]]
        dropped.append(".".join(str(part) for part in path if not isinstance(part, int)))
    return body, dropped


def _key_path(body: dict[str, Any], loc: tuple) -> tuple | None:
    """``loc`` as keys and indices of ``body`` (union member names left out), or ``None``."""
    value: Any = body
    path: list = []
    for part in loc:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            value = value[part]
        elif isinstance(value, dict) and _is_member(part, value):
            continue
        else:
            return None
        path.append(part)
    return tuple(path) if path else None


def _is_member(name: Any, value: dict[str, Any]) -> bool:
    """Whether ``value`` is the SDK type ``name`` of a union, by its ``type`` field."""
    member = getattr(types, name, None) if isinstance(name, str) else None
    if not (isinstance(member, type) and issubclass(member, BaseModel)):
        return False
    field = member.model_fields.get("type")
    return field is not None and field.default == value.get("type")


def _copy_path(body: dict[str, Any], path: tuple) -> dict[str, Any]:
    """A shallow copy of ``body`` and of every container on ``path`` (the caller's is kept)."""
    root = dict(body)
    node: Any = root
    for part in path:
        child = node[part]
        node[part] = dict(child) if isinstance(child, dict) else list(child)
        node = node[part]
    return root


def _describe(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors)


__all__ = ["COERCED", "REQUEST_TYPES", "LoadWeightsRequest", "note", "parse"]
