"""Twinkle client: the ``twinkle`` training API, run on a remote Twinkle server.

Change ``from twinkle.X import Y`` to ``from twinkle_client.X import Y`` and a training script
runs on the server. This package never imports torch.
"""

from twinkle_client._version import __version__

__all__ = ["__version__"]
