"""Where each application's processes run: the GPUs a replica reserves, and its data-parallel ranks.

The seed's rule: ``device_group.ranks`` is the number of GPUs an application uses. A single-process
application (``dp_size`` 1: the transformers or megatron model, vLLM with its own tensor
parallelism) reserves all of them for its Serve replica; with ``dp_size`` N > 1 the replica itself
holds none and each of its N ranks (Ray actors) reserves ``ranks / N``, ``nproc_per_node`` of them
packed on each node. Ray gives every process that reserves GPUs its own ``CUDA_VISIBLE_DEVICES``, so
applications never share a GPU unless a config asks for fractional ``num_gpus`` itself.
``ray_actor_options`` in a deployment apply on top: a ``num_gpus`` written there wins.
"""

from __future__ import annotations

import os
from typing import Any

from twinkle.server.config import ApplicationConfig, ServerConfig

#: What a CPU node keeps for everything but the model replicas: Ray's own processes, the Serve
#: controller, the gateway, the processor and the state store (about 200 MB each), the sampler.
CONTROL_PLANE_RESERVE_MB = 3 << 10
#: Share of the node's memory the model replicas split among them: Ray's memory monitor kills
#: workers at 95% of the node's memory, and a replica must never be what takes it there.
MODEL_SHARE = 0.8


def group_gpus(app_config: ApplicationConfig) -> int:
    """The GPUs (or NPUs) the application's ``device_group`` names; 0 for CPU groups or none."""
    group = getattr(app_config.args, "device_group", None)
    return group.ranks if group is not None and group.is_accelerator else 0


def dp_size(app_config: ApplicationConfig) -> int:
    mesh = getattr(app_config.args, "device_mesh", None)
    return mesh.dp_size if mesh is not None else 1


def megatron_world(app_config: ApplicationConfig) -> bool:
    """A megatron model with tp, pp or ep > 1: one ``ParallelMegatronModel`` world of
    ``dp * pp * tp`` (or ``ep``) ranks, Ray actors that reserve one GPU each
    (:func:`megatron_rank_options`); the replica itself reserves none."""
    args, mesh = app_config.args, getattr(app_config.args, "device_mesh", None)
    return (
        getattr(args, "backend", None) == "megatron"
        and mesh is not None
        and (mesh.tp_size > 1 or mesh.pp_size > 1 or mesh.ep_size > 1)
    )


def replica_num_gpus(app_config: ApplicationConfig) -> float:
    """What the Serve replica reserves: every group GPU when it computes itself, else 0."""
    if app_config.import_path not in ("model", "sampler"):
        return 0
    if dp_size(app_config) > 1 or megatron_world(app_config):
        return 0
    return float(group_gpus(app_config))


def megatron_rank_options(app_config: ApplicationConfig) -> dict[str, Any]:
    """``ray_options`` of a megatron world's rank actors: ``group.ranks / world`` GPUs each on an
    accelerator group (else none), the deployment's ``num_cpus`` and custom ``resources``, and
    ``nproc_per_node`` ranks packed on each node (else one PACK placement group)."""
    args, mesh = app_config.args, app_config.args.device_mesh
    world = mesh.tp_size * mesh.pp_size * (mesh.ep_size if mesh.ep_size > 1 else mesh.dp_size)
    options: dict[str, Any] = {"num_gpus": group_gpus(app_config) / world}
    deployment = app_config.deployments[0] if len(app_config.deployments) == 1 else None
    actor = deployment.ray_actor_options if deployment is not None else None
    if actor is not None and actor.resources:
        options["resources"] = dict(actor.resources)
    if actor is not None and actor.num_cpus is not None:
        options["num_cpus"] = actor.num_cpus
    per_node = min(getattr(args, "nproc_per_node", 1), world)
    if per_node > 1:
        options["nproc_per_node"] = per_node
    return options


def worker_options(app_config: ApplicationConfig) -> dict[str, Any]:
    """Options of each data-parallel rank (``DataParallelModel`` / ``DataParallelSampler``).

    The ranks land where the deployment asks (its custom ``resources`` labels), take its
    ``num_cpus`` per CPU rank, ``ranks / dp_size`` GPUs per accelerator rank, and are packed
    ``nproc_per_node`` to a node.
    """
    args = app_config.args
    options: dict[str, Any] = {}
    deployment = app_config.deployments[0] if len(app_config.deployments) == 1 else None
    actor = deployment.ray_actor_options if deployment is not None else None
    if actor is not None and actor.resources:
        options["resources"] = dict(actor.resources)
    mesh = args.device_mesh
    if mesh.device_type == "cpu":
        if actor is not None and actor.num_cpus is not None:
            options["num_cpus"] = actor.num_cpus
    else:
        options["num_gpus"] = max(1.0, group_gpus(app_config) / mesh.dp_size)
    per_node = min(getattr(args, "nproc_per_node", 1), mesh.dp_size)
    if per_node > 1:
        options["nproc_per_node"] = per_node
    return options


def placement_of(component: Any) -> dict[str, Any]:
    """The replica's own placement and, for a data-parallel component, each rank's."""
    from twinkle.parallel.placement import placement_report

    report: dict[str, Any] = {"replica": placement_report()}
    placements = getattr(component, "placements", None)
    if callable(placements):
        report["workers"] = placements()
    return report


def memory_budget_mb(app_config: ApplicationConfig, config: ServerConfig | None) -> int | None:
    """The memory budget of one replica of a ``model`` or torch ``sampler`` application
    (``execution.memory_budget_mb`` when the config gives one): its deployment's Ray ``memory``
    resource when given (Ray places the replica where that much is free), else, on a CPU
    replica, an equal share of :data:`MODEL_SHARE` of this node's memory less
    :data:`CONTROL_PLANE_RESERVE_MB`, among the config's model and torch-sampler replicas
    (``config`` ``None``: this application's). ``None`` for a replica on accelerators (the
    device's free memory bounds its passes) and for the vllm and mock samplers (vLLM sizes its
    own cache from ``engine_args``; the mock holds no model)."""
    execution = getattr(app_config.args, "execution", None)
    if execution is not None and execution.memory_budget_mb is not None:
        return execution.memory_budget_mb
    if app_config.import_path == "sampler" and not _holds_torch_model(app_config):
        return None
    actor = app_config.deployments[0].ray_actor_options if app_config.deployments else None
    if actor is not None and actor.memory:
        return max(1, actor.memory >> 20)
    if group_gpus(app_config) > 0:
        return None
    apps = config.applications if config is not None else [app_config]
    replicas = sum(
        sum(_most_replicas(d) for d in app.deployments) or 1
        for app in apps
        if _holds_torch_model(app)
    )
    total = _node_memory_mb()
    return max(1, int((total - CONTROL_PLANE_RESERVE_MB) * MODEL_SHARE / max(1, replicas)))


def model_processes(app_config: ApplicationConfig) -> int:
    """How many processes hold the replica's torch model: its data-parallel ranks (Ray actors),
    a megatron world's ranks, else the replica itself (1)."""
    mesh = getattr(app_config.args, "device_mesh", None)
    if megatron_world(app_config):
        return mesh.ep_size if mesh.ep_size > 1 else mesh.dp_size * mesh.pp_size * mesh.tp_size
    return dp_size(app_config)


def process_memory_budget_mb(
    app_config: ApplicationConfig, config: ServerConfig | None
) -> int | None:
    """Each model-holding process's share of the replica's :func:`memory_budget_mb`: the
    replica's budget bounds all its ranks together, so ``dp_size`` ranks get a share each."""
    budget = memory_budget_mb(app_config, config)
    if budget is None:
        return None
    return max(1, budget // model_processes(app_config))


def _holds_torch_model(app_config: ApplicationConfig) -> bool:
    """Whether the application's replicas hold a torch model in their own memory."""
    if app_config.import_path == "model":
        return True
    return app_config.import_path == "sampler" and app_config.args.sampler_type == "torch"


def _most_replicas(deployment: Any) -> int:
    scaling = deployment.autoscaling_config
    return deployment.num_replicas or (scaling.max_replicas if scaling is not None else 1)


def _node_memory_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) >> 10
    except OSError:
        pass
    return (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) >> 20
