"""``twinkle.initialize``: where the components of a training job run.

* ``local``: everything in this process; the returned context only records the groups.
* ``ray``: connect to a Ray cluster (``address='auto'`` or ``'host:port'``) or start a light local
  one, and reserve every device group as a Ray placement group (one bundle per rank), so that
  ``DataParallelModel`` workers and other actors land on the group's devices.
* ``http``: start the Twinkle server (twinkle-server distribution) from Python, as the seed's
  ``server.py`` does, from a server config path, dict or ``ServerConfig``, ``$TWINKLE_SERVER_CONFIG``,
  or from the device groups alone (``twinkle.server.config.from_groups``): each group becomes the
  application of its role, and its devices are reserved by that application's replicas and ranks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinkle._logging import get_logger
from twinkle.env import RAY_USAGE_STATS_ENABLED, TWINKLE_SERVER_CONFIG
from twinkle.parallel.device import DeviceGroup, DeviceMeshError

logger = get_logger(__name__)

MODES = ("local", "ray", "http")
PLACEMENT_TIMEOUT_S = 60.0

_current: TwinkleContext | None = None


@dataclass
class TwinkleContext:
    """What ``initialize`` set up; also a context manager that shuts it down.

    Attributes:
        mode: ``local``, ``ray`` or ``http``.
        groups: The device groups by name.
        placement_groups: ``ray`` mode: a Ray placement group per group (one bundle per rank).
        address: The Ray cluster address (``ray`` and ``http`` modes).
        server_url: ``http`` mode: the gateway's base URL.
        owns_ray: Whether ``initialize`` called ``ray.init`` (then ``shutdown`` disconnects, and
            stops a Ray it started locally).
    """

    mode: str
    groups: dict[str, DeviceGroup] = field(default_factory=dict)
    placement_groups: dict[str, Any] = field(default_factory=dict)
    address: str | None = None
    server_url: str | None = None
    owns_ray: bool = False

    def group(self, name: str) -> DeviceGroup:
        if name not in self.groups:
            raise KeyError(f"no device group {name!r}; groups: {', '.join(self.groups) or 'none'}")
        return self.groups[name]

    def placement_group(self, name: str) -> Any:
        """The Ray placement group reserved for device group ``name`` (``ray`` mode)."""
        self.group(name)
        if name not in self.placement_groups:
            raise KeyError(f"device group {name!r} has no placement group (mode {self.mode!r})")
        return self.placement_groups[name]

    def shutdown(self) -> None:
        """Release the placement groups, stop the server (``http``) and a Ray this started."""
        global _current
        if self.mode in ("ray", "http"):
            import ray

            if ray.is_initialized():
                if self.mode == "http":
                    from twinkle.server.process.launch import shutdown

                    shutdown()
                else:
                    from ray.util import remove_placement_group

                    for pg in self.placement_groups.values():
                        remove_placement_group(pg)
                    if self.owns_ray:
                        ray.shutdown()
        self.placement_groups.clear()
        if _current is self:
            _current = None

    def __enter__(self) -> TwinkleContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def current_context() -> TwinkleContext | None:
    """The context of the last ``initialize`` call (``None`` before one, or after shutdown)."""
    return _current


def initialize(
    mode: str = "local",
    groups: Iterable[DeviceGroup] | None = None,
    address: str | None = None,
    namespace: str | None = None,
    config: str | os.PathLike | dict | Any = None,
    *,
    blocking: bool | None = None,
    placement_timeout_s: float = PLACEMENT_TIMEOUT_S,
) -> TwinkleContext:
    """Set up where Twinkle's components run.

    Args:
        mode: ``local`` (in-process), ``ray`` (a Ray cluster) or ``http`` (start the server).
        groups: The device groups (``DeviceGroup(name='model', ranks=4, device_type='cuda')``).
        address: ``ray``/``http``: an existing cluster (``'auto'`` or ``'host:port'``); ``None``
            starts a local Ray on 127.0.0.1 (``ray``) or uses the server's default (``http``).
        namespace: The Ray namespace.
        config: ``http``: the server config (YAML path, dict or ``ServerConfig``); default
            ``$TWINKLE_SERVER_CONFIG``.
        blocking: ``http``: serve until Ctrl-C (default, as ``server.py`` expects) or return.
        placement_timeout_s: ``ray``: how long the groups' placement groups may take to schedule.

    Returns:
        The context (also available as ``twinkle.parallel.current_context()``).

    Raises:
        ValueError: Unknown mode, duplicate group names, or ``http`` without a config.
        ImportError: ``http`` without twinkle-server installed.
        DeviceMeshError: A placement group the cluster cannot hold, or an ``http`` config whose
            applications need more devices than their group.
    """
    global _current
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    by_name = _groups_by_name(groups)
    if mode == "local":
        context = TwinkleContext(mode="local", groups=by_name)
    elif mode == "ray":
        context = _initialize_ray(by_name, address, namespace, placement_timeout_s)
    else:
        context = _initialize_http(by_name, address, namespace, config, blocking)
    _current = context
    return context


def _groups_by_name(groups: Iterable[DeviceGroup] | None) -> dict[str, DeviceGroup]:
    by_name: dict[str, DeviceGroup] = {}
    for group in groups or ():
        if not isinstance(group, DeviceGroup):
            raise TypeError(f"groups must be DeviceGroup instances, got {type(group).__name__}")
        if group.name in by_name:
            raise ValueError(f"duplicate device group name {group.name!r}")
        by_name[group.name] = group
    return by_name


def connect_ray(
    address: str | None, namespace: str | None, num_cpus: float | None = None
) -> tuple[str, bool]:
    """Connect to ``address`` or start a light local Ray; returns ``(gcs address, initialised)``,
    ``initialised`` False when this process was already connected."""
    import ray

    os.environ.setdefault(RAY_USAGE_STATS_ENABLED.name, "0")
    if ray.is_initialized():
        return ray.get_runtime_context().gcs_address, False
    if address is not None:
        ray.init(address=address, namespace=namespace, log_to_driver=False)
        return ray.get_runtime_context().gcs_address, True
    ray.init(
        address="local",  # never attach to someone else's cluster by accident
        num_cpus=num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        namespace=namespace,
    )
    return ray.get_runtime_context().gcs_address, True


def _initialize_ray(
    groups: dict[str, DeviceGroup], address: str | None, namespace: str | None, timeout_s: float
) -> TwinkleContext:
    import ray
    from ray.util import placement_group, remove_placement_group

    # The machine's CPUs, or more when the groups ask for more (logical CPUs are reservations):
    # actors outside the groups (samplers, the server's replicas) still find room.
    cpus = sum(b.get("CPU", 0.0) for g in groups.values() for b in g.bundles())
    gcs, started = connect_ray(
        address, namespace, num_cpus=max(os.cpu_count() or 1, math.ceil(cpus))
    )
    context = TwinkleContext(mode="ray", groups=groups, address=gcs, owns_ray=started)
    for group in groups.values():
        bundles = group.bundles()
        if not bundles:
            continue
        pg = placement_group(bundles, strategy="PACK", name=f"twinkle-{group.name}")
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            context.shutdown()
            raise DeviceMeshError(
                f"DeviceGroup {group.name!r} needs {len(bundles)} x {bundles[0]} but the Ray cluster "
                f"could not reserve them within {timeout_s:g} s (cluster: {ray.cluster_resources()})"
            ) from None
        context.placement_groups[group.name] = pg
    return context


def _initialize_http(
    groups: dict[str, DeviceGroup],
    address: str | None,
    namespace: str | None,
    config: Any,
    blocking: bool | None,
) -> TwinkleContext:
    try:
        from twinkle.server.process import launch as launch_module
    except ImportError as exc:
        raise ImportError(
            "twinkle.initialize(mode='http') starts the Twinkle server, which ships in the "
            "twinkle-server distribution: pip install twinkle-server"
        ) from exc
    server_config = load_server_config(config, groups)
    check_config_fits_groups(server_config, groups)
    if address is not None:
        connect_ray(address, namespace)
    url = launch_module.launch(server_config, namespace=namespace, blocking=blocking is not False)
    return TwinkleContext(mode="http", groups=groups, server_url=url, address=address)


def load_server_config(config: Any, groups: dict[str, DeviceGroup] | None = None) -> Any:
    """A ``ServerConfig`` from a path, a dict, a ``ServerConfig``, ``$TWINKLE_SERVER_CONFIG``, or
    else built from the device groups alone (the seed's ``server.py``)."""
    from twinkle.server.config import CONFIG_ENV, ServerConfig, load_config, parse_config

    if isinstance(config, ServerConfig):
        return config
    if isinstance(config, dict):
        return parse_config(config)
    if config is None and not TWINKLE_SERVER_CONFIG.is_set():
        if groups:
            from twinkle.server.config.from_groups import config_from_groups

            return config_from_groups(groups.values())
        raise ValueError(
            f"twinkle.initialize(mode='http') needs the server config or device groups: pass "
            f"groups=[DeviceGroup(name='model', ...), ...], config= (a YAML path or dict), or set "
            f"{CONFIG_ENV}"
        )
    return load_config(Path(config) if config is not None else None)


def check_config_fits_groups(server_config: Any, groups: dict[str, DeviceGroup]) -> None:
    """Every accelerator application must fit the ``initialize`` group of the same name.

    Raises:
        DeviceMeshError: An application asks a group for more devices than it has.
    """
    for app in server_config.applications:
        app_group = getattr(app.args, "device_group", None)
        if app_group is None or app_group.name not in groups:
            continue
        group = groups[app_group.name]
        if (
            group.is_accelerator
            and app_group.device_type == group.device_type
            and app_group.ranks > group.ranks
        ):
            raise DeviceMeshError(
                f"application {app.name!r} asks device group {group.name!r} for {app_group.ranks} "
                f"{group.device_type} devices; the group has {group.ranks}"
            )


__all__ = ["TwinkleContext", "current_context", "initialize"]
