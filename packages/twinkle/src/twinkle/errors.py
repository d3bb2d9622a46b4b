"""Errors that mean "the caller did something wrong", as opposed to a fault of the library.

Each one also subclasses the builtin exception the library raised for the same mistake before,
so ``except ValueError`` and ``pytest.raises(RuntimeError)`` keep working. The server answers
these with a 4xx status; any other exception is treated as its own fault (5xx).
:class:`AdapterCapacityError` is the one condition that is neither: the server answers it with a
503 to retry later.
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


__all__ = [
    "AdapterCapacityError",
    "ArgumentTypeError",
    "InvalidArgumentError",
    "NonFiniteUpdateError",
    "PathForbiddenError",
    "PathNotFoundError",
    "StateOrderError",
    "TwinkleError",
    "UnknownAdapterError",
]
