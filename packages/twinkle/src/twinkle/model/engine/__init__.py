"""The tenant engine every backend's model class is built on (see :mod:`._engine`)."""

from twinkle.model.engine._engine import BaseModel, TenantEngine

__all__ = ["BaseModel", "TenantEngine"]
