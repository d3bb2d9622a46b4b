"""The rest of the 0.38 SDK's REST surface: sessions and user checkpoints (:mod:`.sessions`),
admin calls scoped to the caller (:mod:`.admin`) and the batch long-poll (:mod:`.session_futures`).
"""

from __future__ import annotations

from fastapi import APIRouter

from twinkle.server.tinker.admin import admin_routes
from twinkle.server.tinker.api import TinkerApi
from twinkle.server.tinker.session_futures import session_future_routes
from twinkle.server.tinker.sessions import session_routes


def rest_routes(router: APIRouter, api: TinkerApi) -> None:
    """Register every route of this module's parts on the Tinker router."""
    session_routes(router, api)
    admin_routes(router, api)
    session_future_routes(router, api)
