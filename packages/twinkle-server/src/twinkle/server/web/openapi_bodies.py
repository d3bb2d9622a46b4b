"""Request-body schemas for each application's OpenAPI document.

The routes read their JSON bodies themselves (``web.read_json``: size limits, NaN refusal, a 400
that names the field), so FastAPI sees no body parameter and documents none. This module adds the
real bodies to the generated document: the Tinker SDK's own request types for the Tinker routes,
each model operation's pydantic request (with ``adapter_name``) as its own ``POST /<op>`` path,
and hand-written schemas for the sampler and processor operations. Schema-driven fuzzers
(schemathesis) and API clients read them; the routes' behaviour does not depend on them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"
_STR = {"type": "string"}
_INT = {"type": "integer"}
_IDS = {"type": "array", "items": _INT, "minItems": 1}
_NUMS = {"type": "array", "items": {"type": "number"}}

PROTOBUF_BODY = {
    "required": True,
    "content": {"application/x-protobuf": {"schema": {"type": "string", "format": "binary"}}},
}


def _obj(properties: dict[str, Any], required: tuple[str, ...] = (), **extra: Any) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), **extra}


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI ``requestBody`` object holding one JSON object schema."""
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def model_schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    """``model``'s JSON schema with its definitions moved into ``components``."""
    schema = model.model_json_schema(ref_template=_REF)
    components.update(schema.pop("$defs", {}))
    return schema


def document_bodies(
    app: FastAPI,
    bodies: Callable[[dict[str, Any]], Mapping[tuple[str, str], dict[str, Any]]],
    expand: str | None = None,
) -> None:
    """Make ``app.openapi()`` describe request bodies.

    Args:
        app: The application; its generated document is patched once, on first use.
        bodies: ``components -> {(method, path): requestBody}``; the callable may add shared
            definitions to ``components`` (``components/schemas`` of the document).
        expand: A path such as ``/{op}`` that serves several named operations: it is replaced
            by one path per ``POST`` entry of ``bodies`` that the document lacks.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = FastAPI.openapi(app)
        components = spec.setdefault("components", {}).setdefault("schemas", {})
        described = bodies(components)
        paths = spec["paths"]
        template = paths.pop(expand, {}).get("post") if expand else None
        for (method, path), body in described.items():
            if path not in paths and template is not None:
                op = {k: v for k, v in template.items() if k != "parameters"}
                op["operationId"] = f"{path.strip('/').replace('/', '_')}_post"
                op["summary"] = path.strip("/")
                paths[path] = {"post": op}
            operation = paths.get(path, {}).get(method)
            if operation is not None:
                operation["requestBody"] = body
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


def model_bodies(operations: Any) -> Callable[[dict[str, Any]], dict[tuple[str, str], dict]]:
    """``POST /<op>`` of every model operation: its request model plus ``adapter_name``."""

    def bodies(components: dict[str, Any]) -> dict[tuple[str, str], dict]:
        out = {}
        for op in operations:
            if op.internal:  # not served over HTTP
                continue
            schema = model_schema(op.request, components)
            schema.setdefault("properties", {})["adapter_name"] = _STR
            out[("post", f"/{op.name}")] = json_body(schema)
        return out

    return bodies


def sampler_bodies(components: dict[str, Any]) -> dict[tuple[str, str], dict]:
    feature = _obj({"input_ids": _IDS}, ("input_ids",))
    params = _obj(
        {
            "max_tokens": _INT,
            "num_samples": _INT,
            "temperature": {"type": "number"},
            "top_p": {"type": "number"},
            "top_k": _INT,
            "seed": _INT,
            "stop": {"anyOf": [_STR, {"type": "array", "items": {"anyOf": [_STR, _INT]}}]},
            "logprobs": {"anyOf": [{"type": "boolean"}, _INT, {"type": "null"}]},
            "prompt_logprobs": {"anyOf": [{"type": "boolean"}, _INT, {"type": "null"}]},
            "include_stop_str_in_output": {"type": "boolean"},
        }
    )
    sample = _obj(
        {
            "inputs": {"type": "array", "items": {"anyOf": [_IDS, feature]}, "minItems": 1},
            "sampling_params": params,
            "adapter_uri": {"anyOf": [_STR, {"type": "array", "items": _STR}, {"type": "null"}]},
        },
        ("inputs",),
    )
    return {
        ("post", "/sample"): json_body(sample),
        ("post", "/set_template"): json_body(_obj({"template": _STR}, ("template",))),
        ("post", "/add_adapter_to_sampler"): json_body(
            _obj({"adapter_name": _STR, "config": {"type": "object"}}, ("adapter_name",))
        ),
        ("post", "/publish_adapter"): json_body(
            _obj({"adapter_uri": _STR, "config": {"type": "object"}}, ("adapter_uri",))
        ),
    }


def processor_bodies(components: dict[str, Any]) -> dict[tuple[str, str], dict]:
    handle = {"dataset": _STR}
    meta = _obj(
        {"dataset_id": _STR, "subset_name": _STR, "split": _STR, "data_slice": {}},
        ("dataset_id",),
    )
    run = {"num_proc": _INT, "load_from_cache_file": {"type": "boolean"}}
    return {
        ("post", "/create_dataset"): json_body(_obj({"dataset_meta": meta}, ("dataset_meta",))),
        ("post", "/set_template"): json_body(_obj({**handle, "template": _STR}, ("dataset",))),
        ("post", "/map"): json_body(
            _obj(
                {**handle, **run, "preprocessor": _STR, "init_args": {"type": "object"}},
                ("dataset",),
            )
        ),
        ("post", "/filter"): json_body(_obj(handle, ("dataset",))),
        ("post", "/encode"): json_body(
            _obj(
                {
                    **handle,
                    **run,
                    "batched": {"type": "boolean"},
                    "add_generation_prompt": {"type": "boolean"},
                },
                ("dataset",),
            )
        ),
        ("post", "/len"): json_body(_obj(handle, ("dataset",))),
        ("post", "/rows"): json_body(
            _obj({**handle, "indices": {"type": "array", "items": _INT}}, ("dataset",))
        ),
        ("post", "/delete_dataset"): json_body(_obj(handle, ("dataset",))),
    }


def gateway_bodies(components: dict[str, Any]) -> dict[tuple[str, str], dict]:
    """The native management bodies, and the Tinker SDK's request type of each Tinker route."""
    ckpt = "/training_runs/{run_id}/checkpoints/{kind}/{name}"
    out = {
        ("post", "/create_session"): json_body(
            _obj(
                {
                    "tags": {"type": "array", "items": _STR},
                    "user_metadata": {"type": "object"},
                    "sdk_version": _STR,
                    "project_id": _STR,
                    "display_name": _STR,
                }
            )
        ),
        ("post", "/session_heartbeat"): json_body(_obj({"session_id": _STR}, ("session_id",))),
        ("post", "/sessions/{session_id}/finish"): json_body(
            _obj({"reason": _obj({"type": _STR}), "detail": _STR})
        ),
        ("put", f"{ckpt}/ttl"): json_body(
            _obj({"ttl_seconds": {"anyOf": [{"type": "number"}, {"type": "null"}]}})
        ),
        ("put", "/sessions/{session_id}/project"): json_body(_obj({"project_id": _STR})),
        ("post", "/cancel_future"): json_body(_obj({"request_id": _STR}, ("request_id",))),
        ("post", "/publish_live_adapter"): json_body(
            _obj(
                {
                    "base_model": _STR,
                    "adapter_name": _STR,
                    "encoding": {"type": "string", "enum": ["tensors", "base64"]},
                },
                ("base_model",),
            )
        ),
        ("post", "/weights_info"): json_body(_obj({"tinker_path": _STR}, ("tinker_path",))),
        ("post", "/merged_exports"): json_body(
            _obj(
                {"twinkle_path": _STR, "max_shard_size": {"anyOf": [_INT, _STR]}}, ("twinkle_path",)
            )
        ),
        ("post", "/merged_exports/publish"): json_body(
            _obj(
                {
                    "twinkle_path": _STR,
                    "max_shard_size": {"anyOf": [_INT, _STR]},
                    "repo_id": _STR,
                    "hub": {"type": "string", "enum": ["hf", "ms"]},
                    "token": _STR,
                    "private": {"type": "boolean"},
                    "commit_message": _STR,
                },
                ("twinkle_path", "repo_id"),
            )
        ),
        ("post", "/forward_backward"): PROTOBUF_BODY,
    }
    from twinkle.server.tinker.request_fields import REQUEST_TYPES

    for endpoint, model in REQUEST_TYPES.items():
        out[("post", f"/{endpoint}")] = json_body(model_schema(model, components))
    # SDKs before 0.27 send the forward passes as JSON (later ones as protobuf).
    for endpoint, field in (
        ("forward_backward", "forward_backward_input"),
        ("forward", "forward_input"),
    ):
        body = _obj(
            {field: {"type": "object"}, "model_id": _STR, "seq_id": _INT},
            (field, "model_id"),
        )
        content = json_body(body)["content"]
        if endpoint == "forward_backward":
            content = {**PROTOBUF_BODY["content"], **content}
        out[("post", f"/{endpoint}")] = {"required": True, "content": content}
    return out


__all__ = [
    "PROTOBUF_BODY",
    "document_bodies",
    "gateway_bodies",
    "json_body",
    "model_bodies",
    "model_schema",
    "processor_bodies",
    "sampler_bodies",
]
