"""The project's logger: one ``twinkle`` logger with a plain, timestamped console handler."""

from __future__ import annotations

import logging

from twinkle.env import TWINKLE_LOG_LEVEL

_FORMAT = "[%(asctime)s] [%(levelname)s] %(name)s: %(message)s"


def get_logger(name: str = "twinkle") -> logging.Logger:
    """Return a logger under the ``twinkle`` hierarchy.

    The ``twinkle`` logger gets one stream handler the first time it is asked for, unless the
    application already configured logging (the root logger has handlers); the level comes from
    ``TWINKLE_LOG_LEVEL`` (default ``INFO``). Records still propagate, so pytest's ``caplog`` and
    the application's own handlers see them.

    Args:
        name: Logger name; names outside ``twinkle.`` are placed under it.
    """
    if name != "twinkle" and not name.startswith("twinkle."):
        name = f"twinkle.{name}"
    root = logging.getLogger("twinkle")
    if not root.handlers and not getattr(root, "_twinkle_configured", False):
        root._twinkle_configured = True
        root.setLevel(TWINKLE_LOG_LEVEL.get().upper())
        if not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
            root.addHandler(handler)
    return logging.getLogger(name)
