"""Tinker futures on the gateway: run each submitted call as a task, keep its result in the state.

- Every call gets a ``FutureRecord``; its result (JSON, or protobuf bytes base64-encoded) or its
  error is stored there, so ``retrieve_future`` can be answered by any gateway replica.
- Calls of one model run strictly in ``seq_id`` order, one after the other (:class:`ModelLane`):
  the SDK sends ``forward_backward`` and ``optim_step`` without waiting, and may send the chunks
  of one ``forward_backward`` out of order.
- A model that answers ``RateLimited`` / ``AtCapacity`` is retried after its ``retry_after``;
  meanwhile the future reports ``paused_rate_limit`` / ``paused_capacity``. Nothing is dropped.
- Resubmissions (same ``X-Idempotency-Key``, or same model, ``seq_id`` and body) get the first
  submission's request id, also on another replica or after a restart (remembered in the state).
- A future outlives the process running it only as a record: each future names its gateway
  process (``instance``), which keeps a lease in the state while it runs tasks; a pending future
  whose process is gone (killed, restarted) is failed when polled, so a client never waits on a
  result that cannot come.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from twinkle.server.state._base import new_id
from twinkle.server.state._futures import LEASE_TTL_S, UNRECORDED
from twinkle.server.web.errors import (
    AtCapacity,
    RateLimited,
    ServiceError,
    Unavailable,
    from_exception,
)

logger = logging.getLogger("twinkle.server.gateway.tinker")

PROTOBUF = "application/x-protobuf"
STORE_RETRY_S = 1.0  # how often a future's outcome is written again while the store is down


@dataclass
class Proto:
    """A protobuf result (``ForwardBackwardOutput``, ``SampleResponse``)."""

    data: bytes


Runner = Callable[[], Awaitable[Any]]


class ModelLane:
    """Runs one model's calls one at a time, in ``seq_id`` order.

    A call with ``seq_id`` s waits until s - 1 was admitted (or ``gap_timeout`` passed, when a
    client skipped one); a ``seq_id`` at or below the last admitted one (a new client on the same
    model) queues at the end.
    """

    def __init__(self, gap_timeout: float) -> None:
        self.gap_timeout = gap_timeout
        self.last_seq = 0
        self._tail: asyncio.Future | None = None
        self._changed = asyncio.Condition()
        self.admitting = 0  # calls submitted that admit has not let in yet

    @property
    def idle(self) -> bool:
        """Nothing runs or waits in this lane: forgetting it orders nothing wrongly."""
        return self.admitting == 0 and (self._tail is None or self._tail.done())

    async def admit(self, seq_id: int | None) -> tuple[asyncio.Future | None, asyncio.Future]:
        """Wait for the turn of ``seq_id``; returns (the predecessor's done-future, ours)."""
        async with self._changed:
            if seq_id is not None and seq_id > self.last_seq + 1:
                try:
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: self.last_seq >= seq_id - 1),
                        self.gap_timeout,
                    )
                except asyncio.TimeoutError:
                    logger.warning(
                        "seq_id %s waited %.0f s for seq_id %s; running it anyway",
                        seq_id,
                        self.gap_timeout,
                        seq_id - 1,
                    )
            previous, mine = self._tail, asyncio.get_running_loop().create_future()
            self._tail = mine
            if seq_id is not None:
                self.last_seq = max(self.last_seq, seq_id)
            self._changed.notify_all()
            return previous, mine

    async def skip(self, seq_id: int | None) -> None:
        """A call refused before it ran still uses up its ``seq_id``."""
        if seq_id is None:
            return
        async with self._changed:
            self.last_seq = max(self.last_seq, seq_id)
            self._changed.notify_all()


class TinkerFutures:
    """The gateway's futures: submission, ordered execution, retries and long-polling.

    Args:
        state: The server state holding the future records.
        gap_timeout: Seconds a call waits for a missing earlier ``seq_id``.
        max_retry_s: How long a rate-limited call keeps being retried before it fails.
        max_idle_lanes: Idle lanes kept (least recently used dropped first): every training
            client ever created has one, and without a bound they would pile up forever. A
            dropped lane's client that comes back only waits ``gap_timeout`` once.
    """

    def __init__(
        self,
        state: Any,
        gap_timeout: float = 10.0,
        max_retry_s: float = 600.0,
        max_idle_lanes: int = 4096,
    ) -> None:
        self.state = state
        self.gap_timeout, self.max_retry_s = gap_timeout, max_retry_s
        self.max_idle_lanes = max_idle_lanes
        self._lanes: OrderedDict[str, ModelLane] = OrderedDict()
        self._done: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task] = set()
        # Calls that ran but whose outcome the state store (down) did not take: rid -> why.
        self._unrecorded: OrderedDict[str, str] = OrderedDict()
        self.instance = new_id("gw")
        self.started_at = time.time()
        self._lease: asyncio.Task | None = None

    def lane(self, model_id: str) -> ModelLane:
        lane = self._lanes.get(model_id)
        if lane is None:
            lane = self._lanes[model_id] = ModelLane(self.gap_timeout)
            if len(self._lanes) > self.max_idle_lanes:
                self._drop_idle_lanes(keep=model_id)
        self._lanes.move_to_end(model_id)
        return lane

    def _drop_idle_lanes(self, keep: str) -> None:
        """Forget the least recently used idle lanes beyond ``max_idle_lanes``."""
        excess = len(self._lanes) - self.max_idle_lanes
        idle = [m for m, lane in self._lanes.items() if lane.idle and m != keep]
        for model_id in idle[:excess]:
            del self._lanes[model_id]

    def find(self, owner: str, keys: list[tuple]) -> str | None:
        """The request id an earlier identical submission got, if any (to this process, another
        replica, or before a restart: the state's dedupe records, purged with the futures; a
        copy held here would outlive that purge and grow with every call)."""
        for key in keys:
            found = self.state.find_submission(owner, key)
            if found is not None:
                return found
        return None

    def submit(
        self,
        owner: str,
        kind: str,
        runner: Runner,
        *,
        model_id: str | None = None,
        seq_id: int | None = None,
        ordered: bool = True,
        dedupe: list[tuple] | None = None,
    ) -> str:
        """Register a future and start ``runner`` (in ``seq_id`` order for ``model_id``)."""
        self._keep_lease()
        record = self.state.create_future(owner, kind, model_id=model_id, instance=self.instance)
        rid = record.request_id
        for key in dedupe or []:
            self.state.remember_submission(owner, key, rid)
        self._done[rid] = asyncio.Event()
        lane = self.lane(model_id) if (model_id and ordered) else None
        if lane is not None:
            lane.admitting += 1  # not idle from now on: a lane dropped here would lose the order
        task = asyncio.get_running_loop().create_task(self._run(owner, rid, runner, lane, seq_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return rid

    async def _run(
        self, owner: str, rid: str, runner: Runner, lane: ModelLane | None, seq_id: int | None
    ) -> None:
        previous, mine = None, None
        if lane is not None:
            try:
                previous, mine = await lane.admit(seq_id)
            finally:
                lane.admitting -= 1
        try:
            if previous is not None:
                await asyncio.shield(previous)
            await self._execute(owner, rid, runner)
        except Unavailable as exc:  # the store was down when the call ended
            await self._fail_when_store_back(owner, rid, exc.message)
        finally:
            if mine is not None and not mine.done():
                mine.set_result(None)
            self._done.pop(rid, asyncio.Event()).set()

    async def _execute(self, owner: str, rid: str, runner: Runner) -> None:
        deadline = time.monotonic() + self.max_retry_s
        while True:
            try:
                result = await runner()
            except Exception as exc:  # noqa: BLE001 - stored for retrieve_future
                # Logs an unexpected exception with its traceback under the future's id.
                error = from_exception(exc, request_id=rid)
                # Out of memory is an AtCapacity too: the SDK keeps polling a paused future.
                if isinstance(error, (RateLimited, AtCapacity)) and time.monotonic() <= deadline:
                    paused = (
                        "paused_rate_limit" if isinstance(error, RateLimited) else "paused_capacity"
                    )
                    self.state.set_queue_state(owner, rid, paused)
                    await asyncio.sleep(min(max(error.retry_after or 1.0, 0.05), 30.0))
                    continue
                self._fail(owner, rid, error)
                return
            self.state.set_queue_state(owner, rid, "active")
            if isinstance(result, Proto):
                self.state.complete_future(
                    owner,
                    rid,
                    result_b64=base64.b64encode(result.data).decode(),
                    content_type=PROTOBUF,
                )
            else:
                self.state.complete_future(owner, rid, result=result)
            return

    async def _fail_when_store_back(self, owner: str, rid: str, why: str) -> None:
        """Its outcome was not recorded: fail the future (it may have run) as soon as the store
        takes the write, so that a poll on any replica sees it, never "its process stopped"."""
        logger.warning("future %s: its outcome was not recorded: %s", rid, why)
        self._unrecorded[rid] = why  # for settle(), if the store stays down past the deadline
        while len(self._unrecorded) > 20_000:
            self._unrecorded.popitem(last=False)
        deadline = time.monotonic() + self.max_retry_s
        while time.monotonic() < deadline:
            await asyncio.sleep(STORE_RETRY_S)
            try:
                self.state.fail_orphaned_future(owner, rid, UNRECORDED.format(why=why))
            except Unavailable:
                continue
            self._unrecorded.pop(rid, None)
            return

    def _keep_lease(self) -> None:
        """Renew this process's lease now, and every third of its TTL while tasks run."""
        if self._lease is not None and not self._lease.done():
            return
        self.state.renew_instance(self.instance)

        async def renew() -> None:
            while self._tasks:
                await asyncio.sleep(LEASE_TTL_S / 3)
                self.state.renew_instance(self.instance)

        self._lease = asyncio.get_running_loop().create_task(renew())

    def settle(self, owner: str, record: Any) -> Any:
        """``record``, failed first if it is pending in a gateway process that is gone."""
        if record.status != "pending" or record.request_id in self._done:
            return record
        if record.instance == self.instance:  # ours, but its task is gone: never finishes
            why = self._unrecorded.pop(record.request_id, None)
            if why is not None:  # this process lived: never say it stopped
                message = UNRECORDED.format(why=why)
                return self.state.fail_orphaned_future(owner, record.request_id, message)
            return self.state.fail_orphaned_future(owner, record.request_id)
        if record.instance is None:  # written before instances had leases
            if record.created_at >= self.started_at:
                return record
        elif self.state.instance_alive(record.instance):
            return record
        return self.state.fail_orphaned_future(owner, record.request_id)

    def _fail(self, owner: str, rid: str, error: ServiceError) -> None:
        self.state.fail_future(owner, rid, error.message, error.category)

    async def wait(self, owner: str, rid: str, timeout: float) -> Any:
        """The future's record once it is done, or still pending after ``timeout`` seconds."""
        record = self.settle(owner, self.state.get_future(owner, rid))
        deadline = time.monotonic() + timeout
        while record.status == "pending":
            left = deadline - time.monotonic()
            if left <= 0:
                break
            event = self._done.get(rid)
            if event is not None:  # ours: wake up the moment it finishes
                try:
                    await asyncio.wait_for(event.wait(), left)
                except asyncio.TimeoutError:
                    pass
            else:  # submitted to another replica: poll the shared state
                await asyncio.sleep(min(0.2, left))
            record = self.settle(owner, self.state.get_future(owner, rid))
        return record

    async def close(self) -> None:
        if self._lease is not None:
            self._lease.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def body_digest(body: bytes | str) -> str:
    return hashlib.sha256(body if isinstance(body, bytes) else body.encode()).hexdigest()[:32]
