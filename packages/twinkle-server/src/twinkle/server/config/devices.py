"""Where an application runs: a device group (how many devices) and a device mesh (how they split)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from twinkle.server.config import _upstream
from twinkle.server.config._base import StrictModel

DeviceType = Literal["cuda", "cpu", "npu"]
ACCELERATORS = ("cuda", "npu")


def _normalise_device_type(value: object) -> object:
    # The seed configs write ``CPU``; the case carries no meaning.
    if not isinstance(value, str):
        return value
    if value.lower() == "gpu":  # ModelScope Twinkle's DeviceGroup spelling
        _upstream.notice("device_type %r is read as 'cuda'", value)
        return "cuda"
    return value.lower()


class DeviceGroup(StrictModel):
    """A logical group of devices an application occupies.

    Attributes:
        name: the group's name (for logs and placement).
        ranks: the number of devices (GPUs/NPUs) the group uses; for ``cpu`` groups, a CPU index.
        device_type: ``cuda``, ``cpu`` or ``npu`` (any case; stored lower-case).
    """

    name: str = Field(min_length=1)
    ranks: int = Field(ge=0)
    device_type: DeviceType = "cuda"

    _device_type = field_validator("device_type", mode="before")(_normalise_device_type)
    _ranks_list = model_validator(mode="before")(_upstream.migrate_device_ranks)

    @property
    def is_accelerator(self) -> bool:
        """Whether the group holds GPUs/NPUs (and so is checked against the mesh)."""
        return self.device_type in ACCELERATORS


class DeviceMesh(StrictModel):
    """How the devices of a group split into data/tensor/pipeline/expert parallel groups."""

    device_type: DeviceType = "cuda"
    dp_size: int = Field(default=1, ge=1)
    tp_size: int = Field(default=1, ge=1)
    pp_size: int = Field(default=1, ge=1)
    ep_size: int = Field(default=1, ge=1)

    _device_type = field_validator("device_type", mode="before")(_normalise_device_type)

    @property
    def world_size(self) -> int:
        """``dp_size * tp_size * pp_size``: the devices the mesh needs (experts split within)."""
        return self.dp_size * self.tp_size * self.pp_size


def placement_problems(
    group: DeviceGroup | None, mesh: DeviceMesh | None
) -> list[tuple[tuple[str, ...], str]]:
    """Cross-checks of a group and its mesh, as ``(loc, message)`` pairs."""
    if group is None or mesh is None:
        return []
    problems = []
    if (mesh.dp_size * mesh.tp_size) % mesh.ep_size:
        problems.append(
            (
                ("device_mesh", "ep_size"),
                f"{mesh.ep_size} must divide dp_size*tp_size = {mesh.dp_size * mesh.tp_size}",
            )
        )
    if group.device_type != mesh.device_type:
        problems.append(
            (
                ("device_mesh", "device_type"),
                f"'{mesh.device_type}' differs from device_group.device_type '{group.device_type}'",
            )
        )
    elif group.is_accelerator and mesh.world_size > group.ranks:
        problems.append(
            (
                ("device_mesh",),
                f"dp_size*tp_size*pp_size = {mesh.dp_size}*{mesh.tp_size}*{mesh.pp_size} = "
                f"{mesh.world_size} exceeds device_group.ranks = {group.ranks}",
            )
        )
    return problems
