"""A whole server config from device groups alone, as the seed's ``server.py`` starts one::

    twinkle.initialize(mode='http', groups=[DeviceGroup(name='model', ranks=4, device_type='cuda'),
                                            DeviceGroup(name='sampler', ranks=4, device_type='cuda'),
                                            DeviceGroup(name='utility', ranks=0, device_type='cpu')])

Groups are matched by role: ``model`` trains, ``sampler`` generates, a CPU group (``utility`` or
``processor``) runs the processor. An accelerator group of N devices becomes N data-parallel ranks
packed on one node (``nproc_per_node`` N); a CPU group keeps its processes on the CPU. Every
application uses the seed's route prefixes, and the base model is ``$TWINKLE_BASE_MODEL`` (default
the seed's ``Qwen/Qwen3.5-4B``; any model id works: ``tiny://qwen3.5`` on a laptop).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any

from twinkle.server.config.args import base_model_name
from twinkle.server.config.loading import parse_config
from twinkle.server.config.server import ServerConfig
from twinkle.server.env import TWINKLE_BASE_MODEL

BASE_MODEL_ENV = TWINKLE_BASE_MODEL.name
DEFAULT_BASE_MODEL = TWINKLE_BASE_MODEL.default
MODEL_ROLES = ("model",)
SAMPLER_ROLES = ("sampler",)
PROCESSOR_ROLES = ("utility", "processor", "cpu")


def _model_id(environ: Mapping[str, str] | None) -> str:
    given = TWINKLE_BASE_MODEL.get(environ).strip() or DEFAULT_BASE_MODEL
    return given if "://" in given or given.startswith(("/", ".", "~")) else f"ms://{given}"


def _placed(group: Any) -> dict[str, Any]:
    device_type = str(group.device_type).lower()
    accelerator = device_type in ("cuda", "npu")
    ranks = int(group.ranks)
    dp = ranks if accelerator and ranks > 0 else 1
    args: dict[str, Any] = {
        "device_group": {"name": group.name, "ranks": ranks, "device_type": device_type},
        "device_mesh": {"device_type": device_type, "dp_size": dp},
    }
    if accelerator and dp > 1:
        args["nproc_per_node"] = dp
    return args


def _deployment(name: str, group: Any) -> list[dict[str, Any]]:
    actor: dict[str, Any] = {"num_cpus": 0.1}
    if getattr(group, "resources", None):
        actor["resources"] = dict(group.resources)
    return [{"name": name, "ray_actor_options": actor}]


def config_from_groups(
    groups: Iterable[Any], environ: Mapping[str, str] | None = None, **top_level: Any
) -> ServerConfig:
    """The server config the groups describe (``twinkle.parallel.DeviceGroup`` or look-alikes).

    Args:
        groups: Device groups; the ``model`` one is required.
        environ: Where ``TWINKLE_BASE_MODEL`` is read (default: this process's environment).
        **top_level: Further top-level config sections (``http_options``, ``auth``, ...).

    Raises:
        ConfigError: No ``model`` group, or a field the schema refuses.
    """
    from twinkle.server.config._errors import ConfigError

    by_name = {g.name: g for g in groups}
    model_group = next((by_name[n] for n in MODEL_ROLES if n in by_name), None)
    if model_group is None:
        raise ConfigError(
            [f"groups: need a DeviceGroup named 'model' (got: {', '.join(by_name) or 'none'})"]
        )
    model_id = _model_id(environ)
    name = base_model_name(model_id)
    safe = name.replace("/", "-")
    applications: list[dict[str, Any]] = [
        {
            "name": "server",
            "route_prefix": "/api/v1",
            "import_path": "server",
            "args": {"server_config": {"supported_models": [name]}},
            "deployments": [{"name": "TinkerCompatServer", "ray_actor_options": {"num_cpus": 0.1}}],
        },
        {
            "name": f"models-{safe}",
            "route_prefix": f"/api/v1/model/{name}",
            "import_path": "model",
            "args": {"backend": "transformers", "model_id": model_id, **_placed(model_group)},
            "deployments": _deployment("ModelManagement", model_group),
        },
    ]
    sampler_group = next((by_name[n] for n in SAMPLER_ROLES if n in by_name), None)
    if sampler_group is not None:
        vllm = importlib.util.find_spec("vllm") is not None
        applications.append(
            {
                "name": f"sampler-{safe}",
                "route_prefix": f"/api/v1/sampler/{name}",
                "import_path": "sampler",
                "args": {
                    "model_id": model_id,
                    "sampler_type": "vllm" if vllm else "torch",
                    **_placed(sampler_group),
                },
                "deployments": _deployment("SamplerManagement", sampler_group),
            }
        )
    cpu_group = next((by_name[n] for n in PROCESSOR_ROLES if n in by_name), None)
    if cpu_group is not None:
        applications.append(
            {
                "name": "processor",
                "route_prefix": "/api/v1/processor",
                "import_path": "processor",
                "args": {
                    "device_group": {
                        "name": cpu_group.name,
                        "ranks": int(cpu_group.ranks),
                        "device_type": "cpu",
                    }
                },  # fmt: skip
                "deployments": _deployment("ProcessorManagement", cpu_group),
            }
        )
    return parse_config({**top_level, "applications": applications}, source="device groups")
