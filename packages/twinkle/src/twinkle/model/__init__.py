"""Models: the real transformers backend and the numpy-only mock backend.

Names load lazily so that ``from twinkle.model import MockModel`` works without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AdamParams": "twinkle.model.protocol",
    "MultiLoraTransformersModel": "twinkle.model.transformers",
    "TransformersModel": "twinkle.model.transformers",
    "MockModel": "twinkle.model.mock",
    "MultiLoraMegatronModel": "twinkle.model.megatron",
    "Metric": "twinkle.model.metrics",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'twinkle.model' has no attribute {name!r}")
