"""Reinforcement-learning pieces for the sample -> reward -> advantage -> train loop.

The seed's namespace: ``GRPOAdvantage`` and ``RLOOAdvantage`` come from :mod:`twinkle.advantage`,
``MathReward`` and ``final_number`` from :mod:`twinkle.reward`; ``FormatReward`` here defaults to
the pattern ``Answer: -?\\d+`` (``twinkle.reward.FormatReward`` defaults to think/answer tags).
See ``docs/sampling.md``.
"""

from twinkle.advantage import GRPOAdvantage, RLOOAdvantage
from twinkle.reward import MathReward, final_number
from twinkle.rl.rewards import FormatReward

__all__ = ["FormatReward", "GRPOAdvantage", "MathReward", "RLOOAdvantage", "final_number"]
