"""The tenant web console: static pages served by the gateway at ``/console``, and the few JSON
routes they need that no other route answers (``/console/api/...``).

The page calls the gateway's JSON APIs with the key the user typed; every asset ships in this
package (no CDN), so it works offline.
"""

from twinkle.server.console.access import ADMIN_KEYS_ENV, admin_tenants_from_env
from twinkle.server.console.routes import CONSOLE_PATH, create_console_router, static_files

__all__ = [
    "ADMIN_KEYS_ENV",
    "CONSOLE_PATH",
    "admin_tenants_from_env",
    "create_console_router",
    "static_files",
]
