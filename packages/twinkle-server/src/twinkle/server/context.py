"""What every deployment of one server shares: its config, state, key checking and storage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.server.config import ServerArgs, ServerConfig
from twinkle.server.state.server_state import ServerState, StateLimits
from twinkle.server.web.http import Authenticator, authenticator_from
from twinkle.server.web.signing import Signer


@dataclass
class ServerContext:
    """Built once per replica from the server config."""

    config: ServerConfig
    state: ServerState
    authenticate: Authenticator
    server_args: ServerArgs
    signer: Signer
    #: When this process built its context (on the state's clock): session expiry counts from
    #: here at the earliest, since no client could heartbeat while the server was down.
    started_at: float = 0.0
    #: When housekeeping last swept the storage for killed saves' leftovers (monotonic clock).
    partial_sweep_at: float = float("-inf")

    @property
    def storage_root(self) -> Path:
        return Path(self.config.storage.root).expanduser()


def gateway_args(config: ServerConfig) -> ServerArgs:
    """The ``server`` application's args (defaults when the config has none)."""
    for app in config.applications:
        if app.import_path == "server" and isinstance(app.args, ServerArgs):
            return app.args
    return ServerArgs()


def build_context(config: ServerConfig | dict[str, Any], store: Any = None) -> ServerContext:
    """Config, shared state (``store`` or the one the persistence section asks for) and auth."""
    from twinkle.server.ray_store import shared_store
    from twinkle.server.web.auth import ApiKeyAuth

    if isinstance(config, dict):
        config = ServerConfig.model_validate(config)
    args = gateway_args(config)
    state = ServerState(
        store if store is not None else shared_store(config.persistence),
        limits=StateLimits.of(args),
    )
    signer = Signer(state)
    auth = ApiKeyAuth(
        keys=config.auth.api_keys,
        keys_file=config.auth.api_keys_file,
        env_var=config.auth.api_keys_env,
        allow_anonymous=config.auth.allow_anonymous,
        digests=config.auth.api_key_sha256,
        tokens=signer,
        file_digests=config.auth.api_keys_file_sha256,
        reload_interval_s=config.auth.api_keys_reload_s,
    )
    authenticate = authenticator_from(auth)
    if args.rps_limit_per_key:
        authenticate = per_key_rate_limited(authenticate, args.rps_limit_per_key)
    return ServerContext(config, state, authenticate, args, signer, started_at=state.clock())


def per_key_rate_limited(authenticate: Authenticator, rps: float) -> Authenticator:
    """``authenticate`` that also admits at most ``rps`` requests/s per tenant (one bucket per
    API key, so one key's burst never slows another's), refusing with ``RateLimited`` (429)."""
    from twinkle.server.ratelimit import RateLimiter
    from twinkle.server.web.errors import RateLimited

    limiter = RateLimiter(rps_limit=rps)

    def limited(headers: Any) -> str:
        tenant = authenticate(headers)
        try:
            limiter.check(tenant)
        except RateLimited as exc:
            raise RateLimited(
                f"over rps_limit_per_key={rps} requests/s for this API key; "
                f"retry in {exc.retry_after:.2f} s",
                retry_after=exc.retry_after,
            ) from None
        return tenant

    return limited
