"""Losses: one contract (:class:`LossInputs` -> :class:`LossOutput`) and a registry by name.

Names accepted by :func:`get_loss` (``known_losses()`` lists them): ``CrossEntropyLoss``;
preference ``DPOLoss``, ``SimPOLoss``, ``CPOLoss``, ``ORPOLoss``; RL ``GRPOLoss``, ``BNPOLoss``,
``DRGRPOLoss``, ``SAPOLoss``; distillation ``GKDLoss``, ``MSELoss``; embedding ``InfonceLoss``;
the Tinker token losses ``cross_entropy``, ``importance_sampling``, ``ppo``, ``cispo``, ``dro``,
``gspo``, ``stable_reinforce``; and the lower-case aliases ``grpo``, ``bnpo``, ``dr_grpo``,
``sapo``, ``gkd``, ``mse``, ``infonce``, ``dpo``, ``simpo``, ``cpo``, ``orpo``.
"""

from twinkle.loss.base import Loss, LossInputs, LossOutput
from twinkle.loss.cross_entropy import CrossEntropyLoss
from twinkle.loss.distill import GKDLoss, MSELoss
from twinkle.loss.dpo import DPOLoss
from twinkle.loss.embedding import InfonceLoss
from twinkle.loss.fx_graph import CustomGraphLoss
from twinkle.loss.grpo import BNPOLoss, DRGRPOLoss, GRPOLoss, SAPOLoss
from twinkle.loss.gspo import GSPOLoss
from twinkle.loss.preference import CPOLoss, ORPOLoss, SimPOLoss
from twinkle.loss.registry import (
    get_loss,
    known_losses,
    loss_from_spec,
    register_alias,
    register_loss,
)
from twinkle.loss.stable_reinforce import StableReinforceLoss
from twinkle.loss.tinker import (
    CISPOLoss,
    DROLoss,
    ImportanceSamplingLoss,
    PPOLoss,
    TinkerCrossEntropyLoss,
)

# Upstream ModelScope Twinkle's lower-case names; ``cross_entropy``, ``gspo``, ``ppo`` and
# ``cispo`` stay the Tinker losses of those names.
_ALIASES = {
    "grpo": "GRPOLoss",
    "bnpo": "BNPOLoss",
    "dr_grpo": "DRGRPOLoss",
    "sapo": "SAPOLoss",
    "gkd": "GKDLoss",
    "mse": "MSELoss",
    "infonce": "InfonceLoss",
    "InfoNCELoss": "InfonceLoss",
    "dpo": "DPOLoss",
    "simpo": "SimPOLoss",
    "cpo": "CPOLoss",
    "orpo": "ORPOLoss",
}
for _alias, _name in _ALIASES.items():
    register_alias(_alias, _name)

__all__ = [
    "BNPOLoss",
    "CISPOLoss",
    "CPOLoss",
    "CrossEntropyLoss",
    "CustomGraphLoss",
    "DPOLoss",
    "DROLoss",
    "DRGRPOLoss",
    "GKDLoss",
    "GRPOLoss",
    "GSPOLoss",
    "ImportanceSamplingLoss",
    "InfonceLoss",
    "Loss",
    "LossInputs",
    "LossOutput",
    "MSELoss",
    "ORPOLoss",
    "PPOLoss",
    "SAPOLoss",
    "SimPOLoss",
    "StableReinforceLoss",
    "TinkerCrossEntropyLoss",
    "get_loss",
    "loss_from_spec",
    "known_losses",
    "register_alias",
    "register_loss",
]
