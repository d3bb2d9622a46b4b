"""Advantages: per-sample (or per-token) training signal from rewards.

``GRPOAdvantage`` and ``RLOOAdvantage`` work on flat rewards of groups of samples of the same
prompt; ``GAEAdvantage`` on per-token rewards and value estimates. All return numpy arrays (no
torch needed); ``.tolist()`` gives plain floats. See ``docs/sampling.md``.
"""

from twinkle.advantage.base import Advantage
from twinkle.advantage.gae import GAEAdvantage
from twinkle.advantage.grpo import GRPOAdvantage
from twinkle.advantage.rloo import RLOOAdvantage

__all__ = ["Advantage", "GAEAdvantage", "GRPOAdvantage", "RLOOAdvantage"]
