"""The seed's reward defaults, on top of :mod:`twinkle.reward`."""

from __future__ import annotations

from twinkle.reward import FormatReward as _FormatReward


class FormatReward(_FormatReward):
    """:class:`twinkle.reward.FormatReward` whose default pattern is ``Answer: <integer>``."""

    default_pattern = r"Answer: -?\d+"
