"""The ``twinkle-server`` command line."""

from __future__ import annotations

import argparse

from twinkle.server import __version__


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of ``twinkle-server``."""
    parser = argparse.ArgumentParser(
        prog="twinkle-server",
        description="Serve a shared base model to many LoRA tenants (Twinkle and Tinker APIs).",
    )
    parser.add_argument("--version", action="version", version=f"twinkle-server {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    build_parser().parse_args(argv)
    return 0
