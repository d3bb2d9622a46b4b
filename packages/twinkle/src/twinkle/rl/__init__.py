"""Reinforcement-learning pieces for the sample -> reward -> advantage -> train loop.

Advantages (``GRPOAdvantage``, ``RLOOAdvantage``) turn flat per-sequence rewards into per-sequence
advantages for ``model.forward_backward(..., advantages=...)``; rewards (``FormatReward``,
``MathReward``) score what ``Sampler.sample`` returned. See ``docs/sampling.md``.
"""

from twinkle.rl.advantages import GRPOAdvantage, RLOOAdvantage
from twinkle.rl.rewards import FormatReward, MathReward, final_number

__all__ = ["FormatReward", "GRPOAdvantage", "MathReward", "RLOOAdvantage", "final_number"]
