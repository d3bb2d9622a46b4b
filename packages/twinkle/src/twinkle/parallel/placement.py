"""Where a process landed (node, GPUs) and how ranks are packed onto nodes.

Ray assigns GPUs to an actor that asks for ``num_gpus`` and sets its ``CUDA_VISIBLE_DEVICES``; on a
machine whose GPUs are only declared to Ray (``ray start --num-gpus=4`` on a CPU host) the
placement is real while the compute falls back to the CPU, so layouts can be checked anywhere.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from twinkle.env import CUDA_VISIBLE_DEVICES

logger = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 120.0


def compute_device(device_type: str) -> str:
    """The torch device to compute on: ``cuda`` when asked for and present, else ``cpu``."""
    if device_type.lower() != "cuda":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    logger.warning(
        "device_type 'cuda' but no CUDA device is visible here (CUDA_VISIBLE_DEVICES=%r): "
        "computing on the CPU; the GPU placement still holds",
        CUDA_VISIBLE_DEVICES.get(),
    )
    return "cpu"


def rank_bundle(
    num_cpus: float, num_gpus: float, resources: dict[str, float] | None = None
) -> dict[str, float]:
    """What one rank reserves, as a placement-group bundle (zero amounts left out)."""
    bundle = {"CPU": num_cpus, "GPU": num_gpus, **(resources or {})}
    return {k: float(v) for k, v in bundle.items() if v}


def placement_report(device: str | None = None) -> dict[str, Any]:
    """This process's place: Ray node id, assigned resources, ``CUDA_VISIBLE_DEVICES``, pid."""
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "cuda_visible_devices": CUDA_VISIBLE_DEVICES.get(),
        "node_id": None,
        "resources": {},
    }
    if device is not None:
        report["device"] = str(device)
    try:
        import ray

        if ray.is_initialized():
            context = ray.get_runtime_context()
            report["node_id"] = context.get_node_id()
            report["resources"] = {k: float(v) for k, v in context.get_assigned_resources().items()}
            report["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
    except ImportError:
        pass
    return report


class NodePacking:
    """``size`` ranks, ``per_node`` of them on each node: one STRICT_PACK placement group per node.

    Args:
        size: Number of ranks.
        per_node: Ranks per node (``nproc_per_node``); the last node may hold fewer.
        bundle: What each rank reserves (``{"GPU": 1, "CPU": 0.1}``).
        timeout_s: How long the placement groups may take to be scheduled.

    Raises:
        TimeoutError: The cluster has no nodes that can hold the groups (names what was asked).
    """

    def __init__(
        self,
        size: int,
        per_node: int,
        bundle: dict[str, float],
        timeout_s: float = PLACEMENT_TIMEOUT_S,
    ) -> None:
        import ray
        from ray.util import placement_group

        self.size, self.per_node = size, max(1, per_node)
        nodes = math.ceil(size / self.per_node)
        counts = [min(self.per_node, size - i * self.per_node) for i in range(nodes)]
        self.groups = [
            placement_group([dict(bundle) for _ in range(count)], strategy="STRICT_PACK")
            for count in counts
        ]
        ready, _ = ray.wait([g.ready() for g in self.groups], num_returns=nodes, timeout=timeout_s)
        if len(ready) < nodes:
            self.remove()
            raise TimeoutError(
                f"cannot place {size} ranks as {counts} per node with {bundle} each within "
                f"{timeout_s:g} s; the cluster has {ray.available_resources()} available"
            )

    def options(self, rank: int) -> dict[str, Any]:
        """Actor options putting ``rank`` into its node's placement group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.groups[rank // self.per_node],
                placement_group_bundle_index=rank % self.per_node,
            )
        }

    def remove(self) -> None:
        """Release the reservations."""
        from ray.util import remove_placement_group

        for group in self.groups:
            try:
                remove_placement_group(group)
            except Exception:  # already removed, or Ray is gone
                pass
        self.groups = []
