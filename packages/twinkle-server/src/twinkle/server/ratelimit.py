"""Per-tenant token buckets for request and token rates."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from twinkle.server.web.errors import BadRequest, RateLimited


@dataclass
class TokenBucket:
    """``rate`` units per second, bursts up to ``capacity``."""

    rate: float
    capacity: float
    clock: Callable[[], float] = time.monotonic
    level: float = field(init=False)
    updated: float = field(init=False)

    def __post_init__(self) -> None:
        self.level = self.capacity
        self.updated = self.clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def try_take(self, amount: float) -> float:
        """Take ``amount``; returns 0 on success, else the seconds until it would fit."""
        self._refill()
        if amount <= self.level:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate


class RateLimiter:
    """``rps_limit`` requests/s and ``tps_limit`` input tokens/s per tenant; ``max_input_tokens`` per request.

    A request over a rate is refused with :class:`RateLimited` (HTTP 429 with ``retry_after``),
    never dropped silently; one over ``max_input_tokens`` can never fit and is a 400.
    """

    def __init__(
        self,
        rps_limit: float | None = None,
        tps_limit: float | None = None,
        max_input_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rps_limit, self.tps_limit, self.max_input_tokens = (
            rps_limit,
            tps_limit,
            max_input_tokens,
        )
        self.clock = clock
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}
        self.rejections = 0

    def check(self, tenant: str, tokens: int = 0) -> None:
        """Admit one request of ``tokens`` input tokens for ``tenant`` or raise."""
        if self.max_input_tokens is not None and tokens > self.max_input_tokens:
            raise BadRequest(
                f"request has {tokens} input tokens, over max_input_tokens={self.max_input_tokens}"
            )
        if self.rps_limit:
            bucket = self._requests.setdefault(
                tenant, TokenBucket(self.rps_limit, max(1.0, self.rps_limit), self.clock)
            )
            wait = bucket.try_take(1)
            if wait:
                self.rejections += 1
                raise RateLimited(
                    f"over rps_limit={self.rps_limit} requests/s; retry in {wait:.2f} s",
                    retry_after=wait,
                )
        if self.tps_limit and tokens:
            bucket = self._tokens.setdefault(
                tenant, TokenBucket(self.tps_limit, self.tps_limit, self.clock)
            )
            if tokens > bucket.capacity:
                raise BadRequest(
                    f"request has {tokens} input tokens, more than tps_limit={self.tps_limit} allows per second"
                )
            wait = bucket.try_take(tokens)
            if wait:
                self.rejections += 1
                raise RateLimited(
                    f"over tps_limit={self.tps_limit} tokens/s; retry in {wait:.2f} s",
                    retry_after=wait,
                )
