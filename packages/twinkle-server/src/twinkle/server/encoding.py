"""Values -> JSON for replies: the one conversion the client and every server component share."""

from __future__ import annotations

from twinkle_client._wire import jsonable

__all__ = ["jsonable"]
