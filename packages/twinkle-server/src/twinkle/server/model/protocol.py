"""The model deployment's protocol: one pydantic request model per operation, and the table that
names each operation's request model and handler.

A request arrives as ``POST <model route>/<op>`` with a JSON body. :meth:`OperationTable.parse`
validates the body against the operation's model, so a malformed call is refused (400) before it
is queued and before anything changes. Handlers receive the :class:`Call` (who calls, for which
adapter) and the validated request; nothing travels in magic payload keys. Only names travel over
the wire (templates, losses, optimizers): no code is ever received from a client.

Configuration and checkpoint calls forbid unknown fields. The training calls (and the ``set_*``
calls) allow extra fields: they are the keyword arguments of the backend method (loss inputs such
as ``advantages``, a loss's own options), checked by the backend itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from twinkle.server.web.errors import BadRequest, NotFound


@dataclass(frozen=True)
class Call:
    """Who makes a call and for which adapter.

    Attributes:
        owner: The authenticated tenant (its API key's identity).
        name: The adapter's name as the tenant knows it (names are per tenant).
        internal: The adapter's name on the shared model (unique across tenants).
        reason: Why the server itself unloads an adapter (``None`` for a tenant's own calls).
        presented_key: The API key the request presented, for operations that declare
            ``uses_caller_key`` only (else ``None``); never shown in a repr.
    """

    owner: str
    name: str
    internal: str
    reason: str | None = None
    presented_key: str | None = field(default=None, repr=False, compare=False)


class Request(BaseModel):
    """A call whose fields are all known: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def kwargs(self) -> dict[str, Any]:
        """The fields (and allowed extras) as the backend method's keyword arguments."""
        return self.model_dump()


class OpenRequest(Request):
    """A call that forwards extra keyword arguments to the backend method."""

    model_config = ConfigDict(extra="allow", frozen=True)


class Empty(Request):
    """A call without arguments (``backward``, ``step``, ``zero_grad``, ...)."""


class AddAdapter(Request):
    config: dict[str, Any] = Field(default_factory=dict)
    gradient_accumulation_steps: int = Field(1, ge=1)
    session_id: str | None = None
    # A Tinker training run: the adapter's run id is the Tinker model_id.
    training_run_id: str | None = None
    model_seq_id: int = 0
    user_metadata: dict[str, Any] = Field(default_factory=dict)
    # ModelScope Twinkle's client sends where it wants checkpoints; the server keeps a tenant's
    # checkpoints in its own storage, so the value is accepted and not used.
    save_dir: str | None = None

    @property
    def rank(self) -> int:
        rank = self.config.get("r", 8)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise BadRequest(f"config.r (the LoRA rank) must be an integer >= 1, got {rank!r}")
        return rank


class _ByName(OpenRequest):
    """A ``set_*`` call: the component is given by its registered name, never as code."""

    @field_validator(
        "template",
        "processor",
        "loss",
        "optimizer",
        "scheduler",
        "metric_cls",
        mode="before",
        check_fields=False,
    )
    @classmethod
    def _a_name(cls, value: Any, info: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(
                f"{info.field_name} must be given by name over HTTP, got {type(value).__name__}"
            )
        return value


class SetTemplate(_ByName):
    template: str


class SetProcessor(_ByName):
    processor: str


class SetLoss(_ByName):
    loss: str


class SetOptimizer(_ByName):
    optimizer: str


class SetLrScheduler(_ByName):
    scheduler: str


class Training(OpenRequest):
    """``forward_backward``, ``forward``, ``forward_only``: ``inputs`` are encoded features (with
    ``input_ids``) or trajectories (with ``messages``); extras are loss inputs. ``inputs`` is
    checked item by item by ``operations.decode_inputs``, whose messages name the bad item."""

    inputs: Any = None


class CalculateLoss(OpenRequest):
    pass


class MaxGradNorm(Request):
    max_grad_norm: float = Field(1.0, gt=0)


class CalculateMetric(Request):
    is_training: bool = True


class Save(Request):
    name: str = ""
    kind: Literal["weights", "sampler"] | None = None
    is_sampler: bool = False
    save_optimizer: bool = False
    consumed_train_samples: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _sampler_weights_only(self) -> Save:
        if self.save_optimizer and (self.is_sampler or self.kind == "sampler"):
            raise ValueError(
                "a sampler checkpoint (is_sampler=True) holds weights only: drop save_optimizer"
            )
        return self

    @property
    def for_sampler(self) -> bool:
        return self.is_sampler or self.kind == "sampler"


class FromCheckpoint(Request):
    path: str = ""
    checkpoint_dir: str = ""
    load_optimizer: bool = False  # load: the whole training state, as resume_from_checkpoint
    resume_only_model: bool = False  # resume_from_checkpoint: weights and progress only

    @property
    def target(self) -> str:
        return self.path or self.checkpoint_dir


class UploadAdapter(Request):
    """A PEFT adapter directory's files, base64-encoded by file name, to load into the caller's
    adapter and keep as its checkpoint ``name`` (see ``twinkle.server.model.adapter_upload``)."""

    name: str = Field(min_length=1)
    files: dict[str, str]


class UploadToHub(Request):
    """Upload one of the caller's own ``twinkle://`` checkpoints to the ModelScope hub, in the
    background (``hub_token``: a ModelScope token for this upload only)."""

    checkpoint_dir: str = Field(min_length=1)
    hub_model_id: str = Field(min_length=3)
    hub_token: str | None = Field(None, repr=False)
    async_upload: bool = False  # the upload always runs in the background; kept for old clients
    private: bool | None = None
    commit_message: str | None = None

    @field_validator("checkpoint_dir", mode="before")
    @classmethod
    def _path_of_a_save_reply(cls, value: Any) -> Any:
        # ModelScope Twinkle's clients may send save()'s whole reply instead of its path.
        if isinstance(value, dict) and isinstance(value.get("twinkle_path"), str):
            return value["twinkle_path"]
        return value


class UploadStatus(Request):
    """The status of one of the caller's background hub uploads."""

    upload_id: str = Field(min_length=1)


class AddMetric(_ByName):
    """A metric by registered name, for training steps, evaluation or both (``None``)."""

    metric_cls: str
    is_training: bool | None = None


class OptimStep(Request):
    """A Tinker-style step: ``adam_params`` as ``twinkle.model.protocol.AdamParams`` fields."""

    adam_params: dict[str, Any] = Field(default_factory=dict)


Handler = Callable[[Any, Call, Any], Any]

ENVELOPE_FIELDS = ("session_id",)
"""Fields any call may carry for the server itself (telemetry tags spans with the session),
dropped before validation unless the operation takes them."""


@dataclass(frozen=True)
class Operation:
    """One model operation: its request model, its handler and how the service treats it.

    Attributes:
        creates_adapter: The call creates its adapter (admitted first; every other call needs
            an existing adapter).
        trains: Its input tokens count as trained tokens and its ``loss`` as the tenant's last.
        steps: It is an optimizer step (counted in the tenant's progress).
        off_queue: It does not touch the model: it runs on a thread of its own, not in the
            model's queue, and needs no adapter (``upload_to_hub``).
        uses_caller_key: Its handler gets the request's API key (``Call.presented_key``).
        internal: Served to other deployments only (in process or through a handle): its
            result holds tensors, not JSON, so the model's HTTP routes refuse it.
    """

    name: str
    request: type[Request]
    handler: Handler
    creates_adapter: bool = False
    trains: bool = False
    steps: bool = False
    off_queue: bool = False
    uses_caller_key: bool = False
    internal: bool = False


class OperationTable:
    """The operations a model deployment serves, registered explicitly by name."""

    def __init__(self, operations: list[Operation] | None = None) -> None:
        self._ops: dict[str, Operation] = {}
        for op in operations or []:
            self.register(op)

    def register(self, op: Operation) -> None:
        if op.name in self._ops:
            raise ValueError(f"operation {op.name!r} is registered twice")
        self._ops[op.name] = op

    def __add__(self, other: OperationTable) -> OperationTable:
        return OperationTable([*self, *other])

    def __iter__(self) -> Iterator[Operation]:
        return iter(self._ops.values())

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def names(self) -> list[str]:
        return sorted(self._ops)

    def get(self, name: str) -> Operation:
        op = self._ops.get(name)
        if op is None:
            raise NotFound(f"unknown operation {name!r}; known: {', '.join(self.names())}")
        return op

    def parse(self, name: str, body: dict[str, Any]) -> tuple[Operation, Request]:
        """The operation and its validated request; a malformed body is a :class:`BadRequest`."""
        op = self.get(name)
        body = {
            k: v
            for k, v in body.items()
            if k not in ENVELOPE_FIELDS or k in op.request.model_fields
        }
        try:
            return op, op.request.model_validate(body)
        except ValidationError as exc:
            raise BadRequest(f"{name}: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


__all__ = [
    "AddAdapter",
    "AddMetric",
    "Call",
    "CalculateLoss",
    "CalculateMetric",
    "Empty",
    "FromCheckpoint",
    "Handler",
    "MaxGradNorm",
    "Operation",
    "OperationTable",
    "OptimStep",
    "Request",
    "Save",
    "SetLoss",
    "SetLrScheduler",
    "SetOptimizer",
    "SetProcessor",
    "SetTemplate",
    "Training",
    "UploadAdapter",
    "UploadStatus",
    "UploadToHub",
]
