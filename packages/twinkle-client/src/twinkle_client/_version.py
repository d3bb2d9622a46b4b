"""Written by tools/bump_version.py from the root VERSION file."""

__version__ = "0.1.0"
