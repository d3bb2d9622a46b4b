"""How the gateway reaches the model and sampler deployments: in-process or through Ray handles."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from twinkle.server.sampler.protocol import SampleLimits
from twinkle.server.web.errors import InternalError, NotFound, from_exception
from twinkle.server.web.request_ids import current_request_id, new_request_id

logger = logging.getLogger("twinkle.server.gateway")


class OperationClient(Protocol):
    async def call(self, owner: str, op: str, payload: dict[str, Any]) -> Any: ...


class LocalClient:
    """Calls a service object in this process (tests, single-process servers)."""

    def __init__(self, service: Any) -> None:
        self.service = service

    async def call(self, owner: str, op: str, payload: dict[str, Any]) -> Any:
        return await self.service.call(owner, op, payload)

    async def unload_session(self, session_id: str) -> list[str]:
        return await self.service.unload_session(session_id)


class HandleClient:
    """Calls a Serve deployment's ``call`` method through its handle."""

    def __init__(self, deployment: str, app_name: str) -> None:
        self.deployment, self.app_name = deployment, app_name
        self._handle = None

    def _get_handle(self):
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_deployment_handle(self.deployment, app_name=self.app_name)
        return self._handle

    async def call(self, owner: str, op: str, payload: dict[str, Any]) -> Any:
        return await self._remote("call", owner, op, payload)

    async def unload_session(self, session_id: str) -> list[str]:
        return await self._remote("unload_session", session_id)

    async def _remote(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self._get_handle(), method).remote(*args)
        except Exception as exc:
            # Ray wraps the deployment's exception; surface the original ServiceError.
            cause = getattr(exc, "cause", None) or exc.__cause__ or exc
            if _replica_died(exc) or _replica_died(cause):
                raise self._stopped(exc) from None
            raise from_exception(cause) from None

    def _stopped(self, exc: BaseException) -> InternalError:
        """The replica died under the call (SIGKILL, OOM killer): a 5xx that says so, not a
        bare "internal server error"; Serve starts a new replica, which holds no adapter."""
        rid = current_request_id() or new_request_id()
        logger.error("request %s: the %s replica died: %s", rid, self.app_name, exc)
        return InternalError(
            f"the {self.app_name} replica running this call stopped (killed or restarted) "
            "before it answered; retry it, or, if its adapter is then reported lost, resume "
            f"from the newest checkpoint (request id {rid})",
            request_id=rid,
        )


def _replica_died(exc: BaseException) -> bool:
    """Ray's actor-death errors (``ActorDiedError``, ``ActorUnavailableError``), by class name
    so that this module does not import Ray."""
    return any(c.__name__ == "RayActorError" for c in type(exc).__mro__)


@dataclass
class Backends:
    """Model and sampler deployments by base model name (``tiny/qwen3.5``)."""

    models: dict[str, OperationClient] = field(default_factory=dict)
    samplers: dict[str, OperationClient] = field(default_factory=dict)
    max_context: dict[str, int | None] = field(default_factory=dict)
    sample_limits: dict[str, SampleLimits] = field(default_factory=dict)
    max_lora_rank: dict[str, int] = field(default_factory=dict)

    def model(self, base_model: str) -> OperationClient:
        if base_model not in self.models:
            raise NotFound(
                f"unknown base model {base_model!r} (base_model); this server trains: "
                f"{', '.join(self.models) or 'none'}"
            )
        return self.models[base_model]

    def sampler(self, base_model: str) -> OperationClient:
        if base_model not in self.samplers:
            raise NotFound(
                f"base_model {base_model!r} has no sampler here; samplers: "
                f"{', '.join(self.samplers) or 'none'}"
            )
        return self.samplers[base_model]


async def unload_session_adapters(backends: Backends, session_id: str) -> list[str]:
    """Unload every adapter ``session_id`` created, on every model; returns their names."""
    names: list[str] = []
    for client in backends.models.values():
        unload = getattr(client, "unload_session", None)
        if unload is not None:
            names += await unload(session_id) or []
    return names
