"""Twinkle server: Ray Serve deployments (gateway, model, sampler, processor) from one YAML file."""

from twinkle._version import __version__

__all__ = ["__version__"]
