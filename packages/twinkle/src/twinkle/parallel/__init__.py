"""Where Twinkle runs: device groups and meshes, ``initialize``, and data parallelism.

``DeviceGroup``, ``DeviceMesh`` and ``initialize`` import neither torch nor Ray; the data-parallel
classes load torch and Ray when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from twinkle.parallel.device import DeviceGroup, DeviceMesh, DeviceMeshError
from twinkle.parallel.errors import AdapterLostError, WorkerLostError
from twinkle.parallel.initialize import TwinkleContext, current_context, initialize

_LAZY = {
    "DataParallelModel": "twinkle.parallel.data_parallel",
    "DataParallelSampler": "twinkle.parallel.sampler",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AdapterLostError",
    "DataParallelModel",
    "DataParallelSampler",
    "DeviceGroup",
    "DeviceMesh",
    "DeviceMeshError",
    "TwinkleContext",
    "WorkerLostError",
    "current_context",
    "initialize",
]
