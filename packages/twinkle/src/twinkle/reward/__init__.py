"""Rewards: one float per sampled completion.

A reward takes what the scripts have at hand and returns a float32 numpy array, one value per
completion in order (it indexes, iterates and zips like a list; ``.tolist()`` gives floats):

- upstream style: ``reward(trajectories, ground_truths)`` with trajectories as dicts or
  :class:`~twinkle.data_format.Trajectory` (the completion is the last assistant message;
  per-sample data comes from ``user_data`` or ``extra``); ``ground_truths`` may be ``[]``;
- ours: ``reward(sampler.sample(...))`` (a ``SampleResponse`` / list of ``SampleResult``, every
  sequence scored, data from each input's ``extra``) or plain completion strings.

Subclass :class:`Reward` and implement :meth:`Reward.score`, or override ``__call__`` outright.
"""

from twinkle.reward.base import Completion, Reward, completions, user_value
from twinkle.reward.countdown import CountDownAccuracy
from twinkle.reward.format_reward import FormatReward
from twinkle.reward.gsm8k import GSM8KAccuracyReward, GSM8KFormatReward
from twinkle.reward.math_reward import MathReward, boxed_answer, final_number

__all__ = [
    "Completion",
    "CountDownAccuracy",
    "FormatReward",
    "GSM8KAccuracyReward",
    "GSM8KFormatReward",
    "MathReward",
    "Reward",
    "boxed_answer",
    "completions",
    "final_number",
    "user_value",
]
