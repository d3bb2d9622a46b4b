"""Twinkle: many tenants fine-tune LoRA adapters on one shared base model.

Importing ``twinkle`` is cheap: torch and transformers load only when a model, template or
processor is first used, so the numpy-only ``mock`` backend works without torch.
"""

import pkgutil

# The twinkle-server distribution ships ``twinkle/server`` without its own ``twinkle/__init__``;
# extending the path lets that subpackage be found wherever it is installed.
__path__ = pkgutil.extend_path(__path__, __name__)

from twinkle._logging import get_logger  # noqa: E402
from twinkle._version import __version__  # noqa: E402

__all__ = ["__version__", "get_logger"]

# Client entry points re-exported from the twinkle-client distribution, and the placement API
# (twinkle.parallel), loaded on first use.
_LAZY = {
    "init_twinkle_client": "twinkle_client",
    "init_tinker_client": "twinkle_client",
    "DeviceGroup": "twinkle.parallel",
    "DeviceMesh": "twinkle.parallel",
    "initialize": "twinkle.parallel",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'twinkle' has no attribute {name!r}")
