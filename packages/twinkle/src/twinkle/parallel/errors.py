"""Errors of data-parallel models and samplers."""

from __future__ import annotations

# Defined in twinkle.errors, where every library error lives; kept importable from here.
from twinkle.errors import AdapterLostError, WorkerLostError

__all__ = ["AdapterLostError", "WorkerLostError"]
