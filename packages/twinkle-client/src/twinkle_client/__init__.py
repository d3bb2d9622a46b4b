"""Twinkle client: the ``twinkle`` training API, run on a remote Twinkle server.

Change ``from twinkle.X import Y`` to ``from twinkle_client.X import Y`` and a training script
runs on the server. This package never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from twinkle_client._version import __version__
from twinkle_client.tinker_compat import init_tinker_client, init_tinker_compat_client

# Loaded on first use so that ``import twinkle_client`` stays fast (httpx and pydantic load
# with the first name that needs them).
_LAZY = {
    "init_twinkle_client": "twinkle_client.client",
    "TwinkleClient": "twinkle_client.client",
}

__all__ = ["__version__", "init_tinker_client", "init_tinker_compat_client", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'twinkle_client' has no attribute {name!r}")
