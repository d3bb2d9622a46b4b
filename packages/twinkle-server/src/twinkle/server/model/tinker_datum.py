"""Where ModelScope Twinkle's scripts import the datum converters from
(``from twinkle.server.model.tinker_datum import input_feature_to_datum``); they live in
:mod:`twinkle.server.tinker.datum`."""

from twinkle.server.tinker.datum import datum_to_input_feature, input_feature_to_datum

__all__ = ["datum_to_input_feature", "input_feature_to_datum"]
