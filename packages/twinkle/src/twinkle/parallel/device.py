"""Where a component runs: a device group (which devices) and a device mesh (how they split).

Plain dataclasses, free of torch and Ray, mirroring the server YAML's ``device_group`` and
``device_mesh`` blocks (``twinkle.server.config``) so that one script and one YAML say the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from twinkle.errors import DeviceMeshError

ACCELERATORS = ("cuda", "npu")
DEVICE_TYPES = ("cuda", "npu", "cpu")


def _device_type(value: str) -> str:
    # The seed configs write ``CPU``; the case carries no meaning.
    lowered = str(value).lower()
    if lowered not in DEVICE_TYPES:
        raise DeviceMeshError(
            f"device_type must be one of {', '.join(DEVICE_TYPES)}, got {value!r}"
        )
    return lowered


@dataclass(frozen=True)
class DeviceGroup:
    """A named set of devices a component (model, sampler, processor) occupies.

    Args:
        name: The group's name; placement groups and logs use it.
        ranks: For accelerator groups (``cuda``/``npu``), the number of devices. For ``cpu``
            groups it is not a device count (the seed writes ``0``): the mesh's world size is
            the number of CPU processes.
        device_type: ``cuda``, ``npu`` or ``cpu`` (any case).
        num_cpus: CPUs each rank (process) reserves; default 1 for ``cpu`` groups and 1 next to
            each accelerator. Fractions are fine (small test machines).
        resources: Custom Ray resources each rank needs (``{'processor_node': 1}``): node labels
            that pin the group to the nodes started with them (``ray start --resources``).

    Raises:
        DeviceMeshError: Empty name, negative ranks or CPUs, or an unknown device type.
    """

    name: str
    ranks: int = 1
    device_type: str = "cuda"
    num_cpus: float | None = None
    resources: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise DeviceMeshError("DeviceGroup.name must not be empty")
        if not isinstance(self.ranks, int) or self.ranks < 0:
            raise DeviceMeshError(
                f"DeviceGroup {self.name!r}: ranks must be an integer >= 0, got {self.ranks!r}"
            )
        if self.num_cpus is not None and self.num_cpus < 0:
            raise DeviceMeshError(
                f"DeviceGroup {self.name!r}: num_cpus must be >= 0, got {self.num_cpus!r}"
            )
        object.__setattr__(self, "device_type", _device_type(self.device_type))

    @property
    def is_accelerator(self) -> bool:
        """Whether the group holds GPUs/NPUs (whose count bounds the mesh)."""
        return self.device_type in ACCELERATORS

    @property
    def cpus_per_rank(self) -> float:
        return 1.0 if self.num_cpus is None else float(self.num_cpus)

    def rank_resources(self) -> dict[str, float]:
        """What one rank reserves: ``{GPU: 1, CPU: c, **resources}`` or ``{CPU: c, **resources}``."""
        bundle: dict[str, float] = {}
        if self.is_accelerator:
            bundle["GPU" if self.device_type == "cuda" else "NPU"] = 1.0
        if self.cpus_per_rank:
            bundle["CPU"] = self.cpus_per_rank
        bundle.update({k: float(v) for k, v in (self.resources or {}).items()})
        return bundle

    def bundles(self, processes: int | None = None) -> list[dict[str, float]]:
        """Ray placement-group bundles, one per rank.

        Args:
            processes: How many CPU processes a ``cpu`` group runs (its mesh's world size);
                default ``max(ranks, 1)``. Accelerator groups have one bundle per device.
        """
        if self.is_accelerator:
            count = self.ranks
        else:
            count = processes if processes is not None else max(self.ranks, 1)
        return [self.rank_resources() for _ in range(count)]


@dataclass(frozen=True)
class DeviceMesh:
    """How a group's devices split into data/tensor/pipeline/expert parallel groups.

    ``world_size = dp_size * tp_size * pp_size``; experts split within ``dp_size * tp_size``, so
    ``ep_size`` must divide it.

    Raises:
        DeviceMeshError: A size below 1, or ``ep_size`` not dividing ``dp_size * tp_size``.
    """

    device_type: str = "cuda"
    dp_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    ep_size: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_type", _device_type(self.device_type))
        for size in ("dp_size", "tp_size", "pp_size", "ep_size"):
            value = getattr(self, size)
            if not isinstance(value, int) or value < 1:
                raise DeviceMeshError(f"DeviceMesh.{size} must be an integer >= 1, got {value!r}")
        if (self.dp_size * self.tp_size) % self.ep_size:
            raise DeviceMeshError(
                f"ep_size {self.ep_size} must divide dp_size*tp_size = {self.dp_size * self.tp_size}"
            )

    @property
    def world_size(self) -> int:
        """The processes (devices) the mesh needs."""
        return self.dp_size * self.tp_size * self.pp_size

    def check_fits(self, group: DeviceGroup) -> None:
        """Raise unless this mesh can run on ``group``.

        Accelerator groups bound the world size by ``ranks``; ``cpu`` groups run one CPU process
        per mesh rank and are not bounded.

        Raises:
            DeviceMeshError: Different device types, or a world larger than the group.
        """
        if self.device_type != group.device_type:
            raise DeviceMeshError(
                f"DeviceMesh device_type {self.device_type!r} differs from DeviceGroup "
                f"{group.name!r} device_type {group.device_type!r}"
            )
        if group.is_accelerator and self.world_size > group.ranks:
            raise DeviceMeshError(
                f"dp_size*tp_size*pp_size = {self.dp_size}*{self.tp_size}*{self.pp_size} = "
                f"{self.world_size} exceeds DeviceGroup {group.name!r} ranks = {group.ranks}"
            )


__all__ = ["ACCELERATORS", "DeviceGroup", "DeviceMesh", "DeviceMeshError"]
