"""Fair per-tenant queues that fuse waiting calls of different tenants.

Each tenant's calls run strictly in submission order. Tenants are served round-robin: in one
round, if the first head of the line is a fusable call (``forward_backward``, or
``clip_grad_and_step``), the heads of the same kind (up to ``max_fused``) run together: one base
model pass for the ``forward_backward`` calls, one batched optimizer step for the
``clip_grad_and_step`` calls. Any other call at a head runs on its own. No tenant can starve
another. ``max_fused`` caps how many tenants one call carries, not its memory: the model packs the
fused tenants' rows into passes of at most ``execution.max_pass_tokens`` tokens each
(``twinkle.model.step.plan``), so a wide group of large batches runs as several passes whose
gradients accumulate, and a group of small ones as one.

Sizes: a small call must not wait for a large one it happens to meet. Each fusable call has a
size (its input tokens, by ``cost``). A fused group holds at most ``max(group_tokens,
size_ratio x the smallest waiting call)`` tokens, filled in round-robin order: calls too large for
it wait for a group of their own. When the tenant first in line has such a large call, the small
group runs first, once: that large call then runs at its next turn, with whatever fits
``max_fused`` (calls that would wait for it anyway ride along). So a small call shares a fused
call only with calls of its size class, and starts at the latest after the call in progress and
one larger call; a large call yields to at most one small group.

Gathering: a training client sends its next call a short "think time" after it got the answer to
its previous one. When a fusable group is smaller than it could be and some tenants are exactly in
that gap (their last call just finished, nothing queued) and usually arrive within
``fuse_wait_s`` of the group's oldest call, the group waits for them, at most until each one's
latest expected arrival (twice its usual think time, plus 2 ms) and never past that window. Heads
of another kind that are ready run in the meantime; a tenant whose calls are usually too large for
the group is not waited for. Without this, clients that drifted apart stay
apart: half of them run ``forward_backward`` while the other half step, and every pass is half as
wide as it could be.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from twinkle.server.process.threads import model_thread

FUSABLE = ("forward_backward", "clip_grad_and_step")
"""The kinds a scheduler may fuse; the service narrows it to what its backend declares."""
# After these the tenant is gone: the scheduler drops what it learned about its timing.
ENDS_TENANT = ("remove_adapter",)


@dataclass
class Task:
    """One queued call of one tenant."""

    tenant: str
    kind: str
    payload: Any
    future: asyncio.Future
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    size: int = 0  # input tokens (``cost``); 0 for calls without inputs
    yielded: bool = False  # gave its turn to a group of smaller calls once


class FairScheduler:
    """Runs tasks on one worker thread (the model is not thread-safe), fairly across tenants.

    Args:
        run_single: Executes one task, returns its result.
        run_fused: Executes several tenants' tasks of one fusable kind together (they all have
            the same ``kind``), returns their results in order; raising means nothing was applied
            and the tasks are rerun one by one.
        max_fused: Most tenants fused into one call (the model splits it into passes by its
            token budget).
        on_done: Called as ``on_done(task, wait_s, exec_s, ok)`` after every task (metrics).
        executor: The single worker thread tasks run on (default: a new :func:`model_thread`;
            pass the one the model was built on).
        fuse_wait_s: Longest a fusable group waits for tenants expected to join it (0: never).
        fusable: The kinds whose heads may run together (a subset of :data:`FUSABLE`; others
            always run one by one).
        group_tokens: Tokens a fused group may always hold (0: no size rule; every waiting head
            of a kind fuses, up to ``max_fused``).
        size_ratio: A fused group may hold this many times its smallest call's tokens, when that
            is more than ``group_tokens``.
        cost: Input tokens of a task's payload (default: :func:`payload_tokens`).
    """

    def __init__(
        self,
        run_single: Callable[[Task], Any],
        run_fused: Callable[[list[Task]], list[Any]],
        max_fused: int = 8,
        on_done: Callable[[Task, float, float, bool], None] | None = None,
        executor: ThreadPoolExecutor | None = None,
        fuse_wait_s: float = 0.02,
        fusable: tuple[str, ...] = FUSABLE,
        group_tokens: int = 2048,
        size_ratio: float = 4.0,
        cost: Callable[[Any], int] | None = None,
    ) -> None:
        self._run_single, self._run_fused = run_single, run_fused
        self.group_tokens, self.size_ratio = max(0, group_tokens), max(1.0, size_ratio)
        self._cost = cost or payload_tokens
        self._size: dict[str, float] = {}  # tenant -> typical size of its fusable calls
        self.fusable = tuple(kind for kind in fusable if kind in FUSABLE)
        self.max_fused = max(1, max_fused)
        self.fuse_wait_s = max(0.0, fuse_wait_s)
        self._last_done: dict[str, float] = {}  # tenant -> when its last call finished
        self._think_s: dict[str, float] = {}  # tenant -> typical gap until its next call
        self._on_done = on_done
        self._queues: OrderedDict[str, deque[Task]] = OrderedDict()
        self._executor = executor or model_thread()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self.fused_passes = 0  # fused forward_backward passes
        self.fused_steps = 0  # batched optimizer steps
        # Fused runs that failed and were rerun tenant by tenant, and the tenants they held.
        self.fused_fallbacks = 0
        self.fallback_tenants = 0
        self.busy_s = 0.0  # seconds the worker thread spent running tasks

    async def submit(self, tenant: str, kind: str, payload: Any) -> Any:
        """Queue a call and wait for its result (exceptions propagate to the caller)."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._loop())
        task = Task(tenant, kind, payload, loop.create_future())
        if kind in self.fusable and self.group_tokens:
            task.size = max(0, int(self._cost(payload) or 0))
            if kind == "forward_backward":
                before = self._size.get(tenant)
                self._size[tenant] = task.size if before is None else 0.5 * (before + task.size)
        done = self._last_done.pop(tenant, None)
        if done is not None:
            gap = task.enqueued_at - done
            previous = self._think_s.get(tenant)
            self._think_s[tenant] = gap if previous is None else 0.7 * previous + 0.3 * gap
        self._queues.setdefault(tenant, deque()).append(task)
        self._wakeup.set()
        return await task.future

    def depth(self, tenant: str | None = None) -> int:
        """Queued (not yet started) calls, of one tenant or all."""
        if tenant is not None:
            return len(self._queues.get(tenant, ()))
        return sum(len(q) for q in self._queues.values())

    def depths(self) -> dict[str, int]:
        return {tenant: len(q) for tenant, q in self._queues.items() if q}

    def _expected(self, now: float) -> dict[str, tuple[float, float]]:
        """Tenants between two calls that should send the next one soon -> (typical arrival,
        latest arrival still waited for)."""
        expected = {}
        for tenant, done in list(self._last_done.items()):
            think = self._think_s.get(tenant)
            if think is None or self._queues.get(tenant):
                continue
            due = done + 2 * think + 0.002
            if due > now:
                expected[tenant] = (done + think, due)
            else:  # late: not waited for again until its next call
                self._last_done.pop(tenant, None)  # the worker may have dropped it meanwhile
        return expected

    def _next_batch(self, now: float) -> tuple[list[Task], float | None]:
        """The next tasks to run together, or ``([], when)``: nothing is ready before ``when``
        (``None``: nothing queued)."""
        heads = [(tenant, q[0]) for tenant, q in self._queues.items() if q]
        expected = self._expected(now) if self.fuse_wait_s > 0 else {}
        wait_until: float | None = None
        seen: set[str] = set()
        for _, first in heads:
            if first.kind not in self.fusable:
                return self._take([first]), None
            if first.kind in seen:
                continue
            seen.add(first.kind)
            batch, room = self._group([task for _, task in heads if task.kind == first.kind])
            if len(batch) < self.max_fused and expected:
                deadline = min(task.enqueued_at for task in batch) + self.fuse_wait_s
                # Only tenants that usually arrive within the window, with a call that usually
                # fits the group, are worth waiting for.
                sized = first.kind == "forward_backward"
                dues = [
                    due
                    for tenant, (typical, due) in expected.items()
                    if typical <= deadline and (not sized or self._size.get(tenant, 0) <= room)
                ]
                until = min(max(dues), deadline) if dues else now
                if until > now:
                    wait_until = until if wait_until is None else min(wait_until, until)
                    continue
            if batch[0] is not first:
                first.yielded = True  # its turn goes to the smaller calls, once
            return self._take(batch), None
        return [], wait_until

    def _group(self, heads: list[Task]) -> tuple[list[Task], float]:
        """The heads of one kind (round-robin order) that run together, and the tokens the
        group still has room for."""
        if not self.group_tokens:
            return heads[: self.max_fused], float("inf")
        cap = max(self.group_tokens, self.size_ratio * min(task.size for task in heads))
        small, total = [], 0
        for task in heads:
            if len(small) < self.max_fused and total + task.size <= cap:
                small.append(task)
                total += task.size
        if small[0] is heads[0] or not heads[0].yielded:
            return small, cap - total
        # The larger call's turn: those waiting behind it anyway ride along.
        return heads[: self.max_fused], 0.0

    def _take(self, batch: list[Task]) -> list[Task]:
        for task in batch:
            queue = self._queues[task.tenant]
            queue.popleft()
            # Round-robin: a served tenant goes to the back of the line (an emptied queue is
            # dropped; ``submit`` adds it back at the end).
            if queue:
                self._queues.move_to_end(task.tenant)
            else:
                del self._queues[task.tenant]
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while True:
                now = time.monotonic()
                batch, wait_until = self._next_batch(now)
                if batch:
                    for task in batch:
                        task.started_at = now
                    await loop.run_in_executor(self._executor, self._execute, batch)
                    continue
                if wait_until is None:
                    break
                # Gathering: wait for the expected tenants (or for any new call).
                try:
                    await asyncio.wait_for(self._wakeup.wait(), wait_until - now)
                except TimeoutError:
                    pass
                self._wakeup.clear()

    def _execute(self, batch: list[Task]) -> None:
        started = time.monotonic()
        try:
            self._execute_timed(batch, started)
        finally:
            self.busy_s += time.monotonic() - started

    def _execute_timed(self, batch: list[Task], started: float) -> None:
        if len(batch) > 1:
            try:
                results = self._run_fused(batch)
            except Exception:
                # One tenant's bad input must not fail the others: nothing was applied (inputs
                # and losses are checked before the backward pass, a failed backward puts the
                # gradients back, gradients are checked before any optimizer step), so rerun
                # them one by one.
                results = None
                self.fused_fallbacks += 1
                self.fallback_tenants += len(batch)
            if results is not None:
                if batch[0].kind == "forward_backward":
                    self.fused_passes += 1
                else:
                    self.fused_steps += 1
                for task, result in zip(batch, results):
                    self._finish(task, result, None, started)
                return
        for task in batch:
            try:
                self._finish(task, self._run_single(task), None, time.monotonic())
            except Exception as exc:  # noqa: BLE001 - handed to the waiting caller
                self._finish(task, None, exc, time.monotonic())

    def _finish(self, task: Task, result: Any, error: BaseException | None, started: float) -> None:
        if task.kind in ENDS_TENANT:
            self._last_done.pop(task.tenant, None)
            self._think_s.pop(task.tenant, None)
            self._size.pop(task.tenant, None)
        elif not self._queues.get(task.tenant):
            self._last_done[task.tenant] = time.monotonic()
        loop = task.future.get_loop()
        if error is None:
            loop.call_soon_threadsafe(_set_result, task.future, result)
        else:
            loop.call_soon_threadsafe(_set_exception, task.future, error)
        if self._on_done is not None:
            self._on_done(
                task, started - task.enqueued_at, time.monotonic() - started, error is None
            )

    async def between_tasks(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the model thread between two tasks (never beside one)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)


def payload_tokens(payload: Any) -> int:
    """Input tokens of a queued call: those of its request (``payload.request``, the service's
    ``Job``), else of the payload itself; 0 when it has no inputs."""
    from twinkle.server.model.operations import count_tokens

    return count_tokens(getattr(payload, "request", payload))


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
