"""Which keys are operators: the console's admin view answers them only.

An admin key is an ordinary API key (it must be accepted by the server's auth as well) named in
``TWINKLE_CONSOLE_ADMIN_KEYS``: comma-separated keys, or their sha256 hex digests (so a config
management system need not hold the raw key). The server only ever keeps tenant ids, derived
from either form the way :func:`~twinkle.server.state.paths.tenant_id_for_key` derives them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from twinkle.server.env import TWINKLE_CONSOLE_ADMIN_KEYS
from twinkle.server.state.paths import tenant_id_for_key

ADMIN_KEYS_ENV = TWINKLE_CONSOLE_ADMIN_KEYS.name
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def admin_tenants(entries: list[str]) -> frozenset[str]:
    """Tenant ids of ``entries`` (API keys or sha256 hex digests of keys)."""
    tenants = set()
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        tenants.add(entry[:16] if _HEX_DIGEST.fullmatch(entry) else tenant_id_for_key(entry))
    return frozenset(tenants)


def admin_tenants_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Tenant ids of the admin keys named in :data:`ADMIN_KEYS_ENV` (none when unset)."""
    return admin_tenants(TWINKLE_CONSOLE_ADMIN_KEYS.get(environ).split(","))


__all__ = ["ADMIN_KEYS_ENV", "admin_tenants", "admin_tenants_from_env"]
