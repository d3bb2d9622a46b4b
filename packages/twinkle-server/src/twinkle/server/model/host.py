"""What an operation handler sees of the model deployment: :class:`ModelHost`.

Every operation runs as ``handler(host, call, request)`` (see
:class:`~twinkle.server.model.protocol.Operation`). The handlers (the native ones in
:mod:`~twinkle.server.model.operations`, the upload, the live adapter, the Tinker ones) are typed
against this protocol rather than against :class:`~twinkle.server.model.service.ModelService`:
the service imports the handlers' table, so the handlers must not import the service. The
service satisfies the protocol (``tests/packaging/test_architecture.py`` checks it).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from twinkle.hub.upload import UploadTracker
from twinkle.server.hub import HubPublisher
from twinkle.server.model.protocol import Call
from twinkle.server.model.registry import RunRegistry


class AdapterRecord(Protocol):
    """What a handler reads of one tenant adapter (the service's ``AdapterEntry``)."""

    owner: str
    name: str
    internal: str
    run_id: str
    rank: int
    lora_config: dict[str, Any]


@runtime_checkable
class ModelHost(Protocol):
    """The model deployment as its operation handlers use it.

    Attributes:
        model: The backend model every tenant's adapter lives on.
        base_model: The name clients use for it (``tiny/qwen3.5``).
        registry: Where runs and checkpoints are recorded.
        hub: Hub settings and token rule of ``upload_to_hub``.
        uploads: This replica's background hub uploads.
        adapters: The adapters held, by internal name.
        max_loras: Adapters the model holds on its device at once.
        per_token_model_limit: Adapters one API key may hold server-wide (``None``: no limit).
    """

    model: Any
    base_model: str
    registry: RunRegistry
    hub: HubPublisher
    uploads: UploadTracker
    adapters: dict[str, Any]
    max_loras: int
    per_token_model_limit: int | None

    def entry(self, call: Call) -> AdapterRecord:
        """The adapter ``call`` is for (``NotFound`` when it does not exist)."""
        ...

    def adapter_added(
        self,
        call: Call,
        run_id: str,
        rank: int,
        session_id: str | None,
        lora_config: dict[str, Any] | None = None,
    ) -> None:
        """Record the adapter ``call`` created (its run and LoRA config)."""
        ...

    def adapter_removed(self, call: Call, entry: AdapterRecord) -> None:
        """Forget the adapter ``call`` removed (and mark its run)."""
        ...


__all__ = ["AdapterRecord", "ModelHost"]
