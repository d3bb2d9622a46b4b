"""Which of the SDK's optimizer families ``optim_step`` accepts (``tinker.types.optimizer``).

``AdamParams`` (sent as ``adam_params``) is honoured field by field: AdamW with decoupled weight
decay and global-norm clipping (``twinkle.server.model.tinker_ops.check_adam_params``). The SDK's other family,
``DimuonParams`` (sent as ``optimizer_params`` with ``type: "dimuon"``, selected at creation by
``DimuonOptimizerConfig``), names only a learning rate, a clip norm and a momentum coefficient:
the update itself (orthogonalisation, its iterations and scaling, which weights it applies to)
is not defined by the SDK, so it is refused with a 400 naming it rather than guessed.
"""

from __future__ import annotations

from typing import Any

from tinker import types

from twinkle.server.model.tinker_ops import check_adam_params
from twinkle.server.web.errors import BadRequest

_REFUSED = {"dimuon": "DimuonParams"}


def check_optim_params(body: types.OptimStepRequest | dict[str, Any]) -> dict[str, float]:
    """The ``AdamParams`` of an ``optim_step`` request (or its wire dict), with the server's
    defaults for the fields the client left out; any other optimizer family is a 400."""
    if not isinstance(body, types.OptimStepRequest):
        body = types.OptimStepRequest.model_validate(body)
    params = body.optim_params
    if not isinstance(params, types.AdamParams):
        family = _REFUSED.get(params.type, "optimizer_params")
        raise BadRequest(
            f"optim_step: {family} (type {params.type!r}) is not supported by this server, which "
            "trains with AdamW; send AdamParams"
        )
    return check_adam_params(params.model_dump(exclude_unset=True))


__all__ = ["check_optim_params"]
