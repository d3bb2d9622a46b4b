"""Which of the SDK's optimizer families ``optim_step`` accepts (``tinker.types.optimizer``).

``AdamParams`` (sent as ``adam_params``) is honoured field by field: AdamW with decoupled weight
decay and global-norm clipping (``model_ops.check_adam_params``). The SDK's other family,
``DimuonParams`` (sent as ``optimizer_params`` with ``type: "dimuon"``, selected at creation by
``DimuonOptimizerConfig``), names only a learning rate, a clip norm and a momentum coefficient:
the update itself (orthogonalisation, its iterations and scaling, which weights it applies to)
is not defined by the SDK, so it is refused with a 400 naming it rather than guessed.
"""

from __future__ import annotations

from typing import Any

from twinkle.server.errors import BadRequest
from twinkle.server.tinker.model_ops import check_adam_params

_REFUSED = {"dimuon": "DimuonParams"}


def check_optim_params(body: dict[str, Any]) -> dict[str, float]:
    """The ``AdamParams`` of an ``optim_step`` body; any other optimizer family is a 400."""
    other = body.get("optimizer_params")
    if other is None and isinstance(body.get("optim_params"), dict):
        if "type" in body["optim_params"]:
            other = body["optim_params"]
    if other is not None:
        kind = other.get("type") if isinstance(other, dict) else None
        family = (
            _REFUSED.get(kind, "optimizer_params") if isinstance(kind, str) else "optimizer_params"
        )
        raise BadRequest(
            f"optim_step: {family} (type {kind!r}) is not supported by this server, which trains "
            "with AdamW; send AdamParams"
        )
    return check_adam_params(body.get("adam_params") or body.get("optim_params") or {})


__all__ = ["check_optim_params"]
