"""The seed's "Node Rank" YAML (three applications at free route prefixes) and its completion.

The seed gives a model, a sampler and a processor at ``/models/...``, ``/sampler/...`` and
``/processors``, but no gateway and no ``model_id``: ``twinkle-server check-config`` asks for both,
and :func:`completed` adds exactly those.
"""

from __future__ import annotations

import copy

import yaml

NODE_RANK_YAML = """\
applications:
  # 模型服务占用 GPU 0-3（物理卡号）
  - name: models-Qwen3.5-4B
    route_prefix: /models/Qwen/Qwen3.5-4B
    import_path: model
    args:
      nproc_per_node: 4
      device_group:
        name: model
        ranks: 4 # 使用的 GPU 数量
        device_type: cuda
      device_mesh:
        device_type: cuda
        dp_size: 4 # 数据并行大小

  # Sampler 服务占用 GPU 4-5（物理卡号）
  - name: sampler-Qwen3.5-4B
    route_prefix: /sampler/Qwen/Qwen3.5-4B
    import_path: sampler
    args:
      nproc_per_node: 2
      device_group:
        name: sampler
        ranks: 2 # 使用的 GPU 数量
        device_type: cuda
      device_mesh:
        device_type: cuda
        dp_size: 2 # 数据并行大小

  # Processor 服务占用 CPU
  - name: processor
    route_prefix: /processors
    import_path: processor
    args:
      ncpu_proc_per_node: 4
      device_group:
        name: processor
        ranks: 0 # CPU 编号
        device_type: CPU
      device_mesh:
        device_type: CPU
        dp_size: 4 # 数据并行大小
"""

GATEWAY = {"name": "server", "route_prefix": "/api/v1", "import_path": "server", "args": {}}
SEED_MODEL_ID = "ms://Qwen/Qwen3.5-4B"


def seed_data() -> dict:
    """The seed's YAML as it is written (not a valid config on its own)."""
    return yaml.safe_load(NODE_RANK_YAML)


def completed(model_id: str = SEED_MODEL_ID, cpu: bool = False) -> dict:
    """The seed plus what check-config asks for: a gateway and each application's ``model_id``.

    ``cpu=True`` runs it on this machine: one CPU replica each (``dp_size: 1``) and the torch
    sampler; the route prefixes stay the seed's.
    """
    data = copy.deepcopy(seed_data())
    data["applications"].insert(0, copy.deepcopy(GATEWAY))
    for app in data["applications"]:
        if app["import_path"] in ("model", "sampler"):
            app["args"]["model_id"] = model_id
        if cpu and app["import_path"] != "server":
            for key in ("device_group", "device_mesh"):
                app["args"][key]["device_type"] = "cpu"
            app["args"]["device_mesh"]["dp_size"] = 1
            if app["import_path"] == "sampler":
                app["args"]["sampler_type"] = "torch"
    return data
