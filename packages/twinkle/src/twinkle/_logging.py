"""The project's logger: one ``twinkle`` logger with a plain, timestamped console handler."""

from __future__ import annotations

import logging
import os

_FORMAT = "[%(asctime)s] [%(levelname)s] %(name)s: %(message)s"


def get_logger(name: str = "twinkle") -> logging.Logger:
    """Return a logger under the ``twinkle`` hierarchy.

    The root ``twinkle`` logger gets one stream handler the first time it is asked for; the level
    comes from ``TWINKLE_LOG_LEVEL`` (default ``INFO``).

    Args:
        name: Logger name; names outside ``twinkle.`` are placed under it.
    """
    if name != "twinkle" and not name.startswith("twinkle."):
        name = f"twinkle.{name}"
    root = logging.getLogger("twinkle")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("TWINKLE_LOG_LEVEL", "INFO").upper())
        root.propagate = False
    return logging.getLogger(name)
