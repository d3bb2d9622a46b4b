"""A hub upload running on the server: its status, polled until it is done."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from twinkle_client.errors import BadRequestError, TwinkleClientError

DEFAULT_POLL_INTERVAL_S = 2.0
#: Statuses after which an upload's status never changes again.
FINISHED = frozenset({"uploaded", "failed"})


class HubUploadFailedError(BadRequestError):
    """The server's background upload failed (the message says why: a token the hub refused,
    a hub that cannot be reached, ...); nothing needs to be retried on the client side."""


class RemoteUpload(dict):
    """The status of one ``upload_to_hub`` on the server, as a dict that can refresh itself.

    Keys: ``upload_id``, ``status`` (``started``, then ``uploaded`` or ``failed``),
    ``hub_model_id``, ``token`` (whose token: ``caller``, ``request`` or ``server``) and, once
    finished, ``files`` and ``url`` or ``error``.

    Args:
        status: The server's answer.
        fetch: Asks the server for the upload's current status (``upload_status``).
    """

    def __init__(self, status: dict[str, Any], fetch: Callable[[str], dict[str, Any]]) -> None:
        super().__init__(status)
        self._fetch = fetch

    @property
    def upload_id(self) -> str:
        return self["upload_id"]

    def refresh(self) -> RemoteUpload:
        """Ask the server for the current status (unless already finished); returns self."""
        if not self.done():
            self.update(self._fetch(self.upload_id))
        return self

    def done(self) -> bool:
        """Whether the upload has finished, either way (no request: the last status known)."""
        return self.get("status") in FINISHED

    def result(
        self, timeout: float | None = None, poll_interval: float = DEFAULT_POLL_INTERVAL_S
    ) -> RemoteUpload:
        """Wait until the upload finishes, asking every ``poll_interval`` seconds.

        Raises:
            HubUploadFailedError: The upload failed (the server's reason).
            TwinkleClientError: Still running after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done():
            if deadline is not None and time.monotonic() >= deadline:
                raise TwinkleClientError(
                    f"upload {self.upload_id} to {self.get('hub_model_id')} still running after "
                    f"{timeout:g} s; call result() again to keep waiting"
                )
            time.sleep(max(0.05, poll_interval))
        if self["status"] == "failed":
            raise HubUploadFailedError(
                f"upload to {self.get('hub_model_id')} failed: {self.get('error')}",
                status=400,
                code="HubUploadFailed",
            )
        return self

    def __repr__(self) -> str:
        return f"RemoteUpload({dict(self)!r})"


__all__ = ["DEFAULT_POLL_INTERVAL_S", "HubUploadFailedError", "RemoteUpload"]
