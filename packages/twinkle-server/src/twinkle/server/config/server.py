"""The top of the server YAML: HTTP, telemetry, persistence, auth, storage and applications."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from twinkle.env import environ as process_environ
from twinkle.server.config import _upstream
from twinkle.server.config._base import StrictModel, fail, raise_if
from twinkle.server.config.args import (
    ARGS_BY_IMPORT_PATH,
    ModelArgs,
    ProcessorArgs,
    SamplerArgs,
    ServerArgs,
)
from twinkle.server.config.deployment import DeploymentConfig

ImportPath = Literal["server", "model", "sampler", "processor"]


class HttpOptions(StrictModel):
    """Where Serve's HTTP proxy listens."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    request_timeout_s: float | None = Field(default=None, gt=0)
    direct_ingress: bool | None = Field(
        default=None,
        description="serve each ingress replica on its own port too (Ray Serve's direct "
        "ingress, ports 30000+ bound to `host`); default: only when `host` is a loopback address",
    )

    def serves_direct_ingress(self) -> bool:
        """Whether ``launch`` turns direct ingress on: as configured, else only on loopback.

        Ray binds the replicas' own ports to the proxy's ``host``; on a public ``host`` they
        would open further public ports, so that takes ``direct_ingress: true``.
        """
        if self.direct_ingress is not None:
            return self.direct_ingress
        import ipaddress

        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class TelemetryConfig(StrictModel):
    """The OpenTelemetry pipeline (traces, metrics, logs)."""

    enabled: bool = False
    service_name: str = "twinkle-server"
    otlp_endpoint: str = "http://localhost:4317"
    debug: bool = False
    export_interval_ms: int = Field(default=30000, gt=0)
    resource_attributes: dict[str, str | int | float | bool] = Field(default_factory=dict)


class PersistenceConfig(StrictModel):
    """Where server state (sessions, models, futures, runs) is kept across restarts."""

    mode: Literal["memory", "file", "redis"] = "memory"
    file_path: str | None = None
    redis_url: str | None = None
    key_prefix: str = ""

    @model_validator(mode="after")
    def _backend_location(self) -> PersistenceConfig:
        problems = []
        if self.mode == "redis" and not self.redis_url:
            problems.append((("redis_url",), "required when mode is 'redis'"))
        if self.mode == "file" and not self.file_path:
            problems.append((("file_path",), "required when mode is 'file'"))
        raise_if("PersistenceConfig", problems, self.mode)
        return self


class AuthConfig(StrictModel):
    """API keys accepted by the server: the union of the sources below.

    ``launch`` reads every source once, on the machine it runs on, and hands each replica only
    the keys' sha256 digests (``api_key_sha256``; the keys file's in ``api_keys_file_sha256``),
    so replicas on other nodes accept the same keys without the environment variable or the keys
    file being present there. The keys file's path stays: a replica that can read it there
    follows its changes (every ``api_keys_reload_s``); one that cannot keeps the launch digests.
    """

    api_keys: list[str] = Field(default_factory=list)
    api_keys_file: str | None = None
    api_keys_env: str = "TWINKLE_SERVER_API_KEYS"
    api_key_sha256: list[str] = Field(
        default_factory=list, description="hex sha256 digests of accepted keys (no raw keys)"
    )
    api_keys_file_sha256: list[str] = Field(
        default_factory=list,
        description="digests of api_keys_file's keys as launch read them, used by a replica "
        "that cannot read the file on its node",
    )
    api_keys_reload_s: float = Field(
        default=5.0,
        ge=0,
        description="check api_keys_file for changes at most this often (seconds); 0: never",
    )
    allow_anonymous: bool = Field(
        default=False,
        description="accept requests without a key as tenant 'anonymous' (local development only)",
    )
    admin_api_key_sha256: list[str] = Field(
        default_factory=list,
        description="hex sha256 digests of the keys that see the console's operator view "
        "(each must also be an accepted key)",
    )

    @field_validator("api_key_sha256", "api_keys_file_sha256", "admin_api_key_sha256")
    @classmethod
    def _hex_digests(cls, value: list[str]) -> list[str]:
        for digest in value:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"{digest!r} is not a lower-case hex sha256 digest (64 digits)")
        return value

    def key_digests(self, environ: Any = None) -> list[str]:
        """Hex sha256 digests of every accepted key (config, file, ``environ``, digests)."""
        import hashlib

        keys = self.resolve_api_keys(environ)
        digests = [hashlib.sha256(k.encode("utf-8")).hexdigest() for k in keys]
        known = list(self.api_key_sha256) + list(self.api_keys_file_sha256)
        return list(dict.fromkeys(digests + known))

    def sealed(self, environ: Any = None) -> AuthConfig:
        """This config with every key read here and replaced by its digest.

        The keys file's path is kept (it is no secret), its keys' digests go to
        ``api_keys_file_sha256``, the other sources' to ``api_key_sha256``.
        """
        import hashlib

        file_keys = self.file_api_keys()
        without_file = {"api_keys_file": None, "api_keys_file_sha256": []}
        others = self.model_copy(update=without_file).key_digests(environ)
        update = {
            "api_keys": [],
            "api_key_sha256": others,
            "api_keys_file_sha256": list(
                dict.fromkeys(
                    [hashlib.sha256(k.encode("utf-8")).hexdigest() for k in file_keys]
                    + list(self.api_keys_file_sha256)
                )
            ),
        }
        return self.model_copy(update=update)

    def file_api_keys(self) -> list[str]:
        """The keys in ``api_keys_file`` (none without one).

        Raises:
            ConfigError: ``api_keys_file`` is set but cannot be read.
        """
        from twinkle.server.config._errors import ConfigError

        if not self.api_keys_file:
            return []
        path = Path(self.api_keys_file).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as error:
            raise ConfigError([f"auth.api_keys_file: cannot read {path}: {error}"]) from error
        return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]

    def resolve_api_keys(self, environ: Any = None) -> list[str]:
        """All configured keys: ``api_keys``, the file's lines, the env var's comma-separated list.

        Raises:
            ConfigError: ``api_keys_file`` is set but cannot be read.
        """
        keys = list(self.api_keys) + self.file_api_keys()
        environ = process_environ() if environ is None else environ
        keys += [k.strip() for k in environ.get(self.api_keys_env, "").split(",") if k.strip()]
        return list(dict.fromkeys(keys))


class HubConfig(StrictModel):
    """Publishing checkpoints to the ModelScope hub (``upload_to_hub``, Tinker ``publish``).

    The token of a publish is the caller's API key when the hub accepts it as a ModelScope token
    and ``caller_key`` allows it, else the server's own token (``$<token_env>``); see
    ``docs/checkpoints.md``.
    """

    endpoint: str | None = Field(
        default=None, description="the hub's address (default: modelscope's, $MODELSCOPE_ENDPOINT)"
    )
    token_env: str = Field(
        default="MODELSCOPE_API_TOKEN",
        description="environment variable holding the server's own ModelScope token",
    )
    namespace: str | None = Field(
        default=None,
        description="where Tinker publishes with the server's token (default "
        "$TWINKLE_HUB_NAMESPACE, else the token's user)",
    )
    caller_key: Literal["if_no_server_token", "first", "never"] = Field(
        default="first",
        description="when the caller's API key is offered to the hub as its ModelScope token: "
        "first (the seed's rule; the server's token as fallback), only when the server has no "
        "token, or never",
    )
    private: bool = Field(default=True, description="create new hub repositories private")


class StorageConfig(StrictModel):
    """Where checkpoints live: ``<root>/<tenant>/...``."""

    root: str = "~/.cache/twinkle/server"

    @property
    def path(self) -> Path:
        """``root`` with ``~`` expanded."""
        return Path(self.root).expanduser()


class ApplicationConfig(StrictModel):
    """One Serve application; ``args`` are validated by the schema of ``import_path``."""

    name: str = Field(min_length=1)
    route_prefix: str
    import_path: ImportPath
    args: ServerArgs | ModelArgs | SamplerArgs | ProcessorArgs | None = Field(
        default=None, validate_default=True
    )
    deployments: list[DeploymentConfig] = Field(default_factory=list)

    @field_validator("route_prefix")
    @classmethod
    def _route(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must start with '/' (got {value!r})")
        if value != "/" and value.endswith("/"):
            raise ValueError(f"must not end with '/' (got {value!r})")
        if any(c.isspace() for c in value) or "{" in value:
            raise ValueError(f"must be a plain path without spaces or '{{' (got {value!r})")
        return value

    @field_validator("args", mode="wrap")
    @classmethod
    def _args_by_import_path(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        import_path = info.data.get("import_path")
        if import_path is None:  # import_path itself is invalid and already reported
            return None
        schema = ARGS_BY_IMPORT_PATH[import_path]
        if isinstance(value, schema):
            return value
        if value is None:
            value = {}
        elif not isinstance(value, dict):
            fail("ApplicationConfig", [((), f"must be a mapping of {schema.__name__} fields")])
        return schema.model_validate(value)

    @model_validator(mode="after")
    def _unique_deployments(self) -> ApplicationConfig:
        names = Counter(d.name for d in self.deployments)
        raise_if(
            "ApplicationConfig",
            [
                (("deployments",), f"duplicate deployment name '{n}'")
                for n, c in names.items()
                if c > 1
            ],
            None,
        )
        return self

    def deployment(self, name: str) -> DeploymentConfig | None:
        """The deployment called ``name``, or ``None``."""
        return next((d for d in self.deployments if d.name == name), None)


class ServerConfig(StrictModel):
    """The whole server: one YAML file, one ``ServerConfig``."""

    ray_namespace: str | None = Field(
        default=None,
        min_length=1,
        description="the Ray namespace of ``launch`` when neither --namespace nor "
        "$TWINKLE_RAY_NAMESPACE gives one (default: an anonymous namespace)",
    )
    proxy_location: Literal["EveryNode", "HeadOnly", "Disabled"] = "HeadOnly"
    http_options: HttpOptions = Field(default_factory=HttpOptions)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    persistence: PersistenceConfig = Field(default_factory=PersistenceConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    hub: HubConfig = Field(default_factory=HubConfig)
    applications: list[ApplicationConfig] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        return _upstream.migrate_top_level(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _applications_consistent(self) -> ServerConfig:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for field in ("name", "route_prefix"):
            seen: dict[str, int] = {}
            for i, app in enumerate(self.applications):
                value = getattr(app, field)
                if value in seen:
                    problems.append(
                        (("applications", i, field),
                         f"'{value}' is already used by applications[{seen[value]}]")
                    )  # fmt: skip
                seen.setdefault(value, i)
        servers = [i for i, app in enumerate(self.applications) if app.import_path == "server"]
        if len(servers) != 1:
            problems.append(
                (("applications",),
                 f"need exactly one application with import_path 'server', found {len(servers)}")
            )  # fmt: skip
        raise_if("ServerConfig", problems, None)
        return self

    @property
    def server_application(self) -> ApplicationConfig:
        """The gateway application."""
        return next(app for app in self.applications if app.import_path == "server")

    def applications_of(self, import_path: str) -> list[ApplicationConfig]:
        """The applications of one kind, in file order."""
        return [app for app in self.applications if app.import_path == import_path]

    def application(self, name: str) -> ApplicationConfig:
        """The application called ``name``.

        Raises:
            KeyError: no such application.
        """
        for app in self.applications:
            if app.name == name:
                return app
        raise KeyError(name)
