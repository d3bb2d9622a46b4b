"""Losses: one contract (:class:`LossInputs` -> :class:`LossOutput`) and a registry by name.

Names accepted by :func:`get_loss`: ``CrossEntropyLoss``, ``GRPOLoss``, ``DPOLoss`` and the
Tinker token losses ``cross_entropy``, ``importance_sampling``, ``ppo``, ``cispo``, ``dro``, ``gspo``,
``stable_reinforce``.
"""

from twinkle.loss.base import Loss, LossInputs, LossOutput
from twinkle.loss.cross_entropy import CrossEntropyLoss
from twinkle.loss.dpo import DPOLoss
from twinkle.loss.fx_graph import CustomGraphLoss
from twinkle.loss.grpo import GRPOLoss
from twinkle.loss.gspo import GSPOLoss
from twinkle.loss.registry import get_loss, known_losses, loss_from_spec, register_loss
from twinkle.loss.stable_reinforce import StableReinforceLoss
from twinkle.loss.tinker import (
    CISPOLoss,
    DROLoss,
    ImportanceSamplingLoss,
    PPOLoss,
    TinkerCrossEntropyLoss,
)

__all__ = [
    "CISPOLoss",
    "CrossEntropyLoss",
    "CustomGraphLoss",
    "DPOLoss",
    "DROLoss",
    "GRPOLoss",
    "GSPOLoss",
    "ImportanceSamplingLoss",
    "Loss",
    "LossInputs",
    "LossOutput",
    "PPOLoss",
    "StableReinforceLoss",
    "TinkerCrossEntropyLoss",
    "get_loss",
    "loss_from_spec",
    "known_losses",
    "register_loss",
]
