"""Ray Serve options of one deployment: replicas, autoscaling, actor resources, runtime env."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from twinkle.server.config._base import StrictModel, raise_if


class RuntimeEnv(StrictModel):
    """The part of Ray's ``runtime_env`` a deployment may set.

    Attributes:
        env_vars: environment variables of the replicas (numbers are written as strings).
        pip: extra pip requirements installed for the replicas.
        working_dir: a directory shipped to the replicas.
    """

    env_vars: dict[str, str] = Field(default_factory=dict)
    pip: list[str] | None = None
    working_dir: str | None = None

    @field_validator("env_vars", mode="before")
    @classmethod
    def _numbers_as_strings(cls, value: Any) -> Any:
        # YAML reads `TWINKLE_TRUST_REMOTE_CODE: 0` as an int; environment values are strings.
        if isinstance(value, dict):
            return {
                k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                for k, v in value.items()
            }
        return value


class RayActorOptions(StrictModel):
    """Resources of each replica (Ray actor). ``num_cpus`` defaults to 0.1 at launch."""

    num_cpus: float | None = Field(default=None, ge=0)
    num_gpus: float | None = Field(default=None, ge=0)
    memory: int | None = Field(default=None, ge=0, description="bytes")
    resources: dict[str, float] = Field(default_factory=dict)
    runtime_env: RuntimeEnv | None = None


class AutoscalingConfig(StrictModel):
    """Serve autoscaling bounds of a deployment."""

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=1, ge=1)
    target_ongoing_requests: float = Field(default=2, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        raise_if(
            "AutoscalingConfig",
            [
                (
                    ("max_replicas",),
                    f"{self.max_replicas} is below min_replicas = {self.min_replicas}",
                )
            ]
            if self.max_replicas < self.min_replicas
            else [],
            self.max_replicas,
        )
        return self


class DeploymentConfig(StrictModel):
    """Options of one Serve deployment of an application, matched to the builder by ``name``."""

    name: str = Field(min_length=1)
    max_ongoing_requests: int | None = Field(default=None, ge=1)
    num_replicas: int | None = Field(default=None, ge=1)
    autoscaling_config: AutoscalingConfig | None = None
    ray_actor_options: RayActorOptions = Field(default_factory=RayActorOptions)
    runtime_env: RuntimeEnv | None = None

    @model_validator(mode="after")
    def _replicas_xor_autoscaling(self) -> DeploymentConfig:
        both = self.num_replicas is not None and self.autoscaling_config is not None
        raise_if(
            "DeploymentConfig",
            [(("num_replicas",), "set either num_replicas or autoscaling_config, not both")]
            if both
            else [],
            self.num_replicas,
        )
        return self

    def merged_runtime_env(self) -> RuntimeEnv:
        """The deployment's ``runtime_env`` overlaid by ``ray_actor_options.runtime_env``."""
        base = self.runtime_env or RuntimeEnv()
        actor = self.ray_actor_options.runtime_env or RuntimeEnv()
        return RuntimeEnv(
            env_vars={**base.env_vars, **actor.env_vars},
            pip=actor.pip if actor.pip is not None else base.pip,
            working_dir=actor.working_dir if actor.working_dir is not None else base.working_dir,
        )
