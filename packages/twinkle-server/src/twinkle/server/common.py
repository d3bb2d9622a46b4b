"""Kept for scripts written against earlier releases: the converters live in
:mod:`twinkle.server.tinker.datum`."""

from twinkle.server.tinker.datum import datum_to_input_feature, input_feature_to_datum

__all__ = ["datum_to_input_feature", "input_feature_to_datum"]
