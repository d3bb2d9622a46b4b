"""The one HTTP path every remote call takes: auth headers, deadlines, retries, error mapping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from twinkle_client.errors import (
    AuthenticationError,
    PermissionDeniedError,
    ServerUnavailableError,
    TwinkleServerError,
    error_class,
)

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_MAX_RETRIES = 5
# Statuses that mean "not now": over a rate limit, or no room for another adapter yet.
RETRYABLE_STATUSES = (429, 502, 503, 504)
MAX_BACKOFF_S = 60.0


class NotConnectedError(ServerUnavailableError):
    """No connection could be opened: the request was not sent (safe to send elsewhere)."""


class HttpTransport:
    """A synchronous JSON-over-HTTP connection to one Twinkle server.

    Args:
        base_url: ``http://host:port`` of the server (the ``/api/v1`` prefix is added here).
        api_key: Sent as ``Authorization: Bearer <key>``.
        timeout: Seconds a call may take once connected (training calls can be long).
        connect_timeout: Seconds to wait for a connection; an unreachable server fails this fast.
        max_retries: Retries of a 429/502/503/504 answer, with exponential backoff that honours
            ``Retry-After``.
        transport: An ``httpx`` transport (tests pass ``httpx.MockTransport``).
        sleep: How to wait between retries (tests pass a recorder).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._sleep = sleep
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        return self.request("GET", path, params=params, **kw)

    def post(self, path: str, body: dict[str, Any] | None = None, **kw: Any) -> Any:
        return self.request("POST", path, json=body or {}, **kw)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> Any:
        """Send one request and return its JSON body.

        Raises:
            ServerUnavailableError: Unreachable, timed out, or 5xx after every retry.
            TwinkleServerError: A subclass per status (see :mod:`twinkle_client.errors`).
        """
        url = f"{self.base_url}{path}"
        retries = self.max_retries if retries is None else retries
        request_timeout = (
            httpx.USE_CLIENT_DEFAULT if timeout is None else httpx.Timeout(timeout, connect=None)
        )
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, path, json=json, params=params, timeout=request_timeout
                )
            except httpx.ConnectError as exc:
                raise NotConnectedError(
                    f"cannot connect to the Twinkle server at {self.base_url} ({exc}); is it "
                    "running? (set base_url= or TWINKLE_SERVER_URL)",
                    url=url,
                ) from None
            except httpx.TimeoutException as exc:
                raise ServerUnavailableError(
                    f"{method} {url} timed out ({type(exc).__name__}); raise the client's "
                    "timeout= for long operations",
                    url=url,
                ) from None
            except httpx.TransportError as exc:  # sent, then the connection broke: not retried
                raise ServerUnavailableError(
                    f"{method} {url}: the connection broke before the server answered "
                    f"({type(exc).__name__}: {exc}); the server may have stopped or restarted, "
                    "and the call may or may not have run",
                    url=url,
                ) from None
            if response.status_code < 400:
                return response.json() if response.content else None
            error = self._error(response, url)
            if response.status_code not in RETRYABLE_STATUSES or attempt >= retries:
                raise error
            self._sleep(self._delay(attempt, error.retry_after))
            attempt += 1

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """The first retry waits exactly the server's ``retry_after`` (a rate limiter knows when
        the request fits: a longer wait gives the tenant less than its limit); later ones, where
        that was not enough (another thread of the same key took the room), back off."""
        if attempt == 0 and retry_after is not None:
            return retry_after
        backoff = min(MAX_BACKOFF_S, self.backoff_s * 2**attempt)
        return max(backoff, retry_after or 0.0)

    def _error(self, response: httpx.Response, url: str) -> TwinkleServerError:
        status = response.status_code
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        message = str(
            body.get("error") or body.get("detail") or response.text or response.reason_phrase
        )
        # The body's exact seconds, else the header's whole ones.
        retry_after = _retry_after(body.get("retry_after")) or _retry_after(
            response.headers.get("retry-after")
        )
        if status == 401:
            message = (
                "no API key was sent: pass api_key= to init_twinkle_client or set "
                "TWINKLE_SERVER_TOKEN"
                if not self.api_key
                else f"the server at {self.base_url} rejected the API key ({message})"
            )
            cls: type[TwinkleServerError] = AuthenticationError
        elif status == 403:
            message = f"this API key is not allowed to do that: {message}"
            cls = PermissionDeniedError
        else:
            cls = error_class(status)
        return cls(
            message,
            status=status,
            category=body.get("category"),
            code=body.get("code"),
            url=url,
            retry_after=retry_after,
        )


def _retry_after(value: Any) -> float | None:
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return None
