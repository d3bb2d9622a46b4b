"""Where each application of a config answers: the table the gateway publishes at ``GET /routes``.

Route prefixes are configuration: clients read this table instead of assuming a layout.
"""

from __future__ import annotations

from typing import Any

from twinkle.server.config import (
    ModelArgs,
    ProcessorArgs,
    SamplerArgs,
    ServerConfig,
    base_model_name,
)


def route_table(config: ServerConfig) -> dict[str, Any]:
    """The route prefix of every application of ``config``, as absolute paths.

    Returns:
        ``{"gateway": "/api/v1", "models": {base model: prefix}, "samplers": {base model:
        prefix}, "processors": [prefix, ...]}`` (base models named as the server serves them,
        ``Qwen/Qwen3.5-4B``; processors in file order).
    """
    table: dict[str, Any] = {
        "gateway": config.server_application.route_prefix,
        "models": {},
        "samplers": {},
        "processors": [],
    }
    for app in config.applications:
        if isinstance(app.args, ModelArgs):
            table["models"][base_model_name(app.args.model_id)] = app.route_prefix
        elif isinstance(app.args, SamplerArgs):
            table["samplers"][base_model_name(app.args.model_id)] = app.route_prefix
        elif isinstance(app.args, ProcessorArgs):
            table["processors"].append(app.route_prefix)
    return table
