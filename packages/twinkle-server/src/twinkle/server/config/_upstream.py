"""ModelScope Twinkle's server YAML layout, read into ours with one notice per migrated field.

Their cookbook configs run unmodified: each field they spell differently is moved to where it
lives here, and a warning on the ``twinkle.server.config`` logger says what it was read as. A
field that contradicts the one it migrates to is an error naming both. Everything else stays
strict: a misspelt field is refused as before.
"""

from __future__ import annotations

import logging
from typing import Any

from twinkle.server.config._base import fail

logger = logging.getLogger("twinkle.server.config")

# Their task-queue knobs that have no counterpart in our token-bucket limiter: read and ignored.
_QUEUE_WITHOUT_COUNTERPART = {
    "window_seconds": "rates are token buckets refilled continuously, not counted per window",
    "token_cleanup_multiplier": "per-tenant buckets need no cleanup setting",
    "token_cleanup_interval": "per-tenant buckets need no cleanup setting",
    "queue_timeout": "calls wait in the fair queue without a server-side deadline",
    "execution_timeout": "calls run without a server-side deadline",
}
_QUEUED_KINDS = ("model", "sampler")


def notice(message: str, *args: Any) -> None:
    """Say what a field of the upstream layout was read as."""
    logger.warning(message, *args)


def migrate_server_args(data: dict) -> None:
    """``args.supported_models`` (theirs) -> ``args.server_config.supported_models`` (ours)."""
    if "supported_models" not in data:
        return
    models = data.pop("supported_models")
    settings = data.get("server_config")
    settings = dict(settings) if isinstance(settings, dict) else {}
    given = settings.get("supported_models")
    if given is not None and given != models:
        fail(
            "ServerArgs",
            [
                (
                    ("supported_models",),
                    f"{models} contradicts server_config.supported_models {given}",
                )
            ],
            models,
        )
    notice("args.supported_models belongs in args.server_config: read as "
           "server_config.supported_models: %s", models)  # fmt: skip
    settings["supported_models"] = models
    data["server_config"] = settings


def migrate_gpus_per_worker(kind: str, data: dict) -> None:
    """Drop ``device_group.gpus_per_worker`` when the mesh implies the same count.

    Here a model worker is one process on one device, and a sampler engine spans ``tp_size``
    devices, so the mesh already says how many devices each worker holds.
    """
    group = data.get("device_group")
    if not isinstance(group, dict) or "gpus_per_worker" not in group:
        return
    group = dict(group)
    given = group.pop("gpus_per_worker")
    mesh = data.get("device_mesh") if isinstance(data.get("device_mesh"), dict) else {}
    tp = mesh.get("tp_size", 1)
    implied, why = (
        (tp, f"each sampler engine spans device_mesh.tp_size = {tp} devices")
        if kind == "SamplerArgs"
        else (1, "each worker process holds one device")
    )
    if given != implied:
        fail(
            kind,
            [
                (
                    ("device_group", "gpus_per_worker"),
                    f"{given!r} contradicts the mesh: {why}; "
                    "remove gpus_per_worker or change device_mesh",
                )
            ],  # fmt: skip
            given,
        )
    notice("device_group.gpus_per_worker is derived from the device mesh here (%s): "
           "read and dropped", why)  # fmt: skip
    data["device_group"] = group


def migrate_device_ranks(data: Any) -> Any:
    """``ranks: [0, 1, 2, 3]`` (device indices) -> ``ranks: 4`` (a count)."""
    if not isinstance(data, dict) or not isinstance(data.get("ranks"), list):
        return data
    ranks = data["ranks"]
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        return data  # the schema reports the bad entries
    notice("device_group.ranks %s is a list of device indices: read as ranks: %d (the devices "
           "are placed by Ray; restrict them with CUDA_VISIBLE_DEVICES)", ranks, len(ranks))  # fmt: skip
    return {**data, "ranks": len(ranks)}


def migrate_queue(data: Any) -> Any:
    """Their ``queue_config`` / ``task_queue`` fields without a counterpart here."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for key, why in _QUEUE_WITHOUT_COUNTERPART.items():
        if key in data:
            notice("queue_config.%s has no counterpart here (%s): ignored", key, why)
            data.pop(key)
    if "enabled" in data:
        enabled = data.pop("enabled")
        if enabled is False:
            notice("queue_config.enabled: false: read as no rps_limit and no tps_limit")
            data.pop("rps_limit", None)
            data.pop("tps_limit", None)
        elif enabled is True:
            notice("queue_config.enabled: true: limits apply wherever rps_limit or tps_limit "
                   "is set; read and dropped")  # fmt: skip
        else:
            fail("QueueConfig", [(("enabled",), "must be true or false")], enabled)
    return data


def migrate_processor_queue(data: dict) -> None:
    """The processor has no request queue here: its ``queue_config`` is read and dropped."""
    if "queue_config" in data:
        data.pop("queue_config")
        notice("processor args.queue_config: the processor is not rate limited here: ignored")


def migrate_top_level(data: dict) -> dict:
    """``task_queue`` (theirs): the default ``queue_config`` of every model and sampler."""
    if "task_queue" not in data:
        return data
    data = dict(data)
    defaults = data.pop("task_queue")
    if defaults is None:
        return data
    if not isinstance(defaults, dict):
        fail("ServerConfig", [(("task_queue",), "must be a mapping of queue_config fields")])
    notice("task_queue is read as the default queue_config of each model and sampler "
           "application (their own queue_config fields take precedence)")  # fmt: skip
    applications = data.get("applications")
    if not isinstance(applications, list):
        return data
    merged = []
    for app in applications:
        if isinstance(app, dict) and app.get("import_path") in _QUEUED_KINDS:
            args = dict(app.get("args") or {})
            own = args.get("queue_config")
            if own is None or isinstance(own, dict):
                args["queue_config"] = {**defaults, **(own or {})}
                app = {**app, "args": args}
        merged.append(app)
    data["applications"] = merged
    return data
