"""The server YAML as strict pydantic models: load, validate, migrate, print.

``load_config(path)`` returns a ``ServerConfig`` or raises ``ConfigError`` listing every problem as
``<dotted.field.path>: <message>``. ``dump_config`` prints the normalised config.
"""

from twinkle.server.config._errors import ConfigError
from twinkle.server.config.args import (
    AdapterConfig,
    GatewaySettings,
    ModelArgs,
    ProcessorArgs,
    QueueConfig,
    SamplerArgs,
    ServerArgs,
    base_model_name,
)
from twinkle.server.config.deployment import (
    AutoscalingConfig,
    DeploymentConfig,
    RayActorOptions,
    RuntimeEnv,
)
from twinkle.server.config.devices import DeviceGroup, DeviceMesh
from twinkle.server.config.loading import (
    CONFIG_ENV,
    config_path,
    config_to_dict,
    dump_config,
    load_config,
    parse_config,
)
from twinkle.server.config.server import (
    ApplicationConfig,
    AuthConfig,
    HttpOptions,
    PersistenceConfig,
    ServerConfig,
    StorageConfig,
    TelemetryConfig,
)

__all__ = [
    "CONFIG_ENV",
    "AdapterConfig",
    "ApplicationConfig",
    "AuthConfig",
    "AutoscalingConfig",
    "ConfigError",
    "DeploymentConfig",
    "DeviceGroup",
    "DeviceMesh",
    "GatewaySettings",
    "HttpOptions",
    "ModelArgs",
    "PersistenceConfig",
    "ProcessorArgs",
    "QueueConfig",
    "RayActorOptions",
    "RuntimeEnv",
    "SamplerArgs",
    "ServerArgs",
    "ServerConfig",
    "StorageConfig",
    "TelemetryConfig",
    "base_model_name",
    "config_path",
    "config_to_dict",
    "dump_config",
    "load_config",
    "parse_config",
]
