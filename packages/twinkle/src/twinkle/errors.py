"""Errors that mean "the caller did something wrong", as opposed to a fault of the library.

Each one also subclasses the builtin exception the library raised for the same mistake before,
so ``except ValueError`` and ``pytest.raises(RuntimeError)`` keep working. The server answers
the :class:`TwinkleError` ones with a 4xx status; any other exception is treated as its own
fault (5xx). :class:`AdapterCapacityError` is the one condition that is neither: the server
answers it with a 503 to retry later.

Every error the library raises for its callers to catch is defined here (the modules that
raise them re-export them), so that the server and scripts match them by type without
importing a backend, torch or Ray. The faults of the environment (a model that cannot be
found, a lost data-parallel worker or adapter) are here too, below the caller's mistakes.
"""

from __future__ import annotations


class TwinkleError(Exception):
    """Base class of the caller's mistakes."""


class InvalidArgumentError(TwinkleError, ValueError):
    """An argument has a wrong value or shape (unknown name, out of range, mismatched rows)."""


class ArgumentTypeError(TwinkleError, TypeError):
    """An argument has the wrong type, or an unexpected argument was passed."""


class UnknownAdapterError(InvalidArgumentError, KeyError):
    """An adapter name that the model does not hold (also a ``ValueError`` and a ``KeyError``)."""

    def __str__(self) -> str:
        # KeyError would quote the message; show it as written.
        return str(self.args[0]) if self.args else ""


class StateOrderError(TwinkleError, RuntimeError):
    """A call out of order, such as ``step`` before ``forward_backward``."""


class NonFiniteUpdateError(TwinkleError, FloatingPointError):
    """An optimizer step that would make an adapter's weights non-finite (NaN or infinite): it
    was not applied, and the adapter is as it was before the call."""


class PathNotFoundError(TwinkleError, FileNotFoundError):
    """A path the caller named (an adapter or checkpoint directory) does not exist."""


class PathForbiddenError(TwinkleError, PermissionError):
    """A path the caller named lies outside the directories it may use."""


class AdapterCapacityError(RuntimeError):
    """No slot for an adapter: every resident one is busy, or paging storage is full.

    Not the caller's mistake: retry later (the server maps it to 503 ``paused_capacity``).
    Raised by :mod:`twinkle.model.paging`; defined here so that it is matched by type without
    importing torch.
    """


class RemoteCodeRefusedError(InvalidArgumentError):
    """A model needs code shipped in its repository and ``TWINKLE_TRUST_REMOTE_CODE`` is off."""


class HubUploadError(TwinkleError, RuntimeError):
    """An upload that cannot be done as asked: no modelscope package, no token, a token the hub
    rejects."""


class HubUnreachableError(HubUploadError):
    """The hub cannot be reached from here (no route, no DNS, refused, timed out). Retrying at
    once does not help: the message names the address tried."""


class MissingFieldError(ValueError):
    """A row lacks a field its preprocessor needs.

    Attributes:
        field: The missing field's name.
    """

    def __init__(self, field: str, message: str | None = None) -> None:
        super().__init__(message or f"missing field {field!r}")
        self.field = field


class DeviceMeshError(ValueError):
    """A device mesh that does not fit its device group, or an inconsistent mesh."""


# The errors below are faults of the environment, not the caller's mistakes (5xx on a server).


class ModelNotFoundError(FileNotFoundError):
    """A model id names nothing that is available locally, and it cannot be downloaded."""


class WorkerLostError(RuntimeError):
    """A data-parallel worker (Ray actor) died; the replicas must be recovered.

    Attributes:
        rank: The rank whose actor died.
    """

    def __init__(self, rank: int, detail: str = "") -> None:
        self.rank = rank
        super().__init__(
            f"data-parallel worker rank {rank} was lost{': ' + detail if detail else ''}. "
            "Pending and further calls fail until recover() restarts the replicas and reloads "
            "each adapter from its last checkpoint"
        )


class AdapterLostError(RuntimeError):
    """An adapter's state is gone or untrusted (lost with a worker, or replicas diverged).

    It raises on every use until ``add_adapter_to_model`` re-creates it or
    ``resume_from_checkpoint`` / ``load`` restores it.
    """


__all__ = [
    "AdapterCapacityError",
    "AdapterLostError",
    "ArgumentTypeError",
    "DeviceMeshError",
    "HubUnreachableError",
    "HubUploadError",
    "InvalidArgumentError",
    "MissingFieldError",
    "ModelNotFoundError",
    "NonFiniteUpdateError",
    "PathForbiddenError",
    "PathNotFoundError",
    "RemoteCodeRefusedError",
    "StateOrderError",
    "TwinkleError",
    "UnknownAdapterError",
    "WorkerLostError",
]
