"""Fixtures of the console tests (defined in :mod:`console_server`)."""

from console_server import alice_run, server, url  # noqa: F401
