"""What every multi-LoRA training backend offers: the typed surface the server programs against.

``AdamParams`` is a wire type, defined in ``twinkle_client.model`` (so a remote script builds the
very same object) and re-exported here. Backends (``MultiLoraTransformersModel``, ``MultiLoraMegatronModel``, ``DataParallelModel``,
``MockModel``) declare what they can do in :class:`Capabilities` instead of letting callers probe
with ``getattr``. This module imports neither torch nor numpy, so the server's protocol layer can
use it without pulling in a backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from twinkle.errors import InvalidArgumentError
from twinkle_client.model.adam import AdamParams


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond the common surface of :class:`TrainingModel`.

    Callers ask these (``capabilities_of(model).adapter_paging``) instead of probing a model's
    type or attributes. Two declarations are equal when their fused steps are (what the
    scheduler groups tenants' calls by); the adapter capabilities are read one by one.

    Attributes:
        fused_forward_backward: ``forward_backward_many``: several tenants' micro-batches in ONE
            pass through the base model.
        batched_optimizer_step: ``clip_grad_and_step_many``: several tenants' optimizer steps
            with shared multi-tensor kernels.
        adapter_paging: ``enable_paging``: more adapters than fit on the device, idle ones
            paged out to host memory or disk.
        adapter_state_io: ``adapter_state_dict``, ``load_adapter_state_dict`` and
            ``adapter_peft_config``: an adapter's weights handed over or replaced in memory,
            with no checkpoint on disk.
        local_tenants: ``tenant(adapter_name)``: the adapter's live
            :class:`~twinkle.model.tenant.Tenant` (its step count, ...) is in this process.
    """

    fused_forward_backward: bool = False
    batched_optimizer_step: bool = False
    adapter_paging: bool = field(default=False, compare=False)
    adapter_state_io: bool = field(default=False, compare=False)
    local_tenants: bool = field(default=False, compare=False)


def adam_params(params: AdamParams | Mapping[str, Any] | None) -> AdamParams:
    """``params`` as :class:`AdamParams` (see :meth:`AdamParams.coerce`).

    Raises:
        InvalidArgumentError: A field Adam cannot use, or an unknown field.
    """
    try:
        return AdamParams.coerce(params)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


@runtime_checkable
class TrainingModel(Protocol):
    """The surface every backend implements; every method takes ``adapter_name=``."""

    capabilities: Capabilities

    def add_adapter_to_model(
        self, adapter_name: str, config: Any = None, **kwargs: Any
    ) -> None: ...

    def remove_adapter(self, adapter_name: str | None = None) -> None: ...

    def list_adapters(self) -> list[str]: ...

    def set_loss(self, loss: Any, adapter_name: str | None = None, **kwargs: Any) -> None: ...

    def set_optimizer(
        self, optimizer: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> None: ...

    def forward_backward(
        self, inputs: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]: ...

    def forward_only(
        self, inputs: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]: ...

    def clip_grad_and_step(
        self, max_grad_norm: float = 1.0, adapter_name: str | None = None
    ) -> bool: ...

    def optim_step(
        self,
        adam_params: AdamParams | Mapping[str, Any] | None = None,
        adapter_name: str | None = None,
    ) -> dict[str, float]: ...

    def get_train_configs(self, adapter_name: str | None = None) -> Any: ...

    def save(self, name: str, output_dir: Any = None, **kwargs: Any) -> str: ...

    def load(self, path: Any, adapter_name: str | None = None, **kwargs: Any) -> None: ...

    def resume_from_checkpoint(self, path: Any, adapter_name: str | None = None) -> dict: ...


def capabilities_of(model: Any) -> Capabilities:
    """A model's declared :class:`Capabilities` (a backend that declares none has only the
    common surface)."""
    declared = getattr(type(model), "capabilities", None)
    return declared if isinstance(declared, Capabilities) else Capabilities()


__all__ = ["AdamParams", "Capabilities", "TrainingModel", "adam_params", "capabilities_of"]
