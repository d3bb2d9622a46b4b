"""FairScheduler gathering: tenants between two calls are waited for, within bounds."""

from __future__ import annotations

import asyncio
import time

from twinkle.server.model.scheduler import FairScheduler, Task

FB_S, STEP_S, THINK_S = 0.02, 0.002, 0.003


class Recorder:
    """Fake model: sleeps like a pass would and records every batch it ran."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, tuple[str, ...]]] = []
        self.waits: dict[str, list[float]] = {}  # tenant -> queue wait of each of its calls

    def _run(self, tasks: list[Task]) -> list[str]:
        self.batches.append((tasks[0].kind, tuple(sorted(t.tenant for t in tasks))))
        for t in tasks:
            self.waits.setdefault(t.tenant, []).append(t.started_at - t.enqueued_at)
        time.sleep(FB_S if tasks[0].kind == "forward_backward" else STEP_S)
        return [t.tenant for t in tasks]

    def single(self, task: Task) -> str:
        return self._run([task])[0]

    def fused(self, tasks: list[Task]) -> list[str]:
        return self._run(tasks)

    def passes(self, kind: str = "forward_backward") -> list[tuple[str, ...]]:
        return [tenants for k, tenants in self.batches if k == kind]


async def tenant_loop(
    scheduler: FairScheduler, tenant: str, steps: int, delay: float, think: float = THINK_S
) -> None:
    """A training client: forward_backward, think, clip_grad_and_step, think, ..."""
    await asyncio.sleep(delay)
    for _ in range(steps):
        for kind in ("forward_backward", "clip_grad_and_step"):
            assert await scheduler.submit(tenant, kind, {}) == tenant
            await asyncio.sleep(think)


def run_clients(fuse_wait_s: float, plan: dict[str, tuple]) -> Recorder:
    """Run one ``tenant_loop`` per ``plan`` entry ``tenant: (steps, delay[, think])``."""
    recorder = Recorder()

    async def main() -> None:
        scheduler = FairScheduler(recorder.single, recorder.fused, fuse_wait_s=fuse_wait_s)
        try:
            await asyncio.gather(*(tenant_loop(scheduler, t, *args) for t, args in plan.items()))
        finally:
            scheduler.close()

    asyncio.run(main())
    return recorder


def test_clients_out_of_phase_are_gathered_into_one_pass():
    # b starts half a pass after a: without gathering, b's forward_backward would run alone
    # while a steps. (Not asserted on the ungathered run: a loaded CI machine sometimes delays
    # one client by half a pass and brings the two into phase by itself.)
    plan = {"a": (12, 0.0), "b": (12, FB_S / 2)}
    gathered = run_clients(0.05, plan).passes()
    both = [p for p in gathered if p == ("a", "b")]
    assert len(both) >= 10 and len(gathered) <= 14, gathered


def test_a_tenant_that_stops_costs_the_others_at_most_one_short_wait():
    started = time.monotonic()
    waits = run_clients(0.2, {"a": (10, 0.0), "b": (3, 0.0)}).waits["a"]
    elapsed = time.monotonic() - started
    # b left after 3 steps; a is never held for the full 0.2 s window, and its waits stay
    # within b's expected arrival (2 x think time + 2 ms, plus scheduling slack).
    assert max(waits) < 0.05, waits
    assert sum(waits) < 0.1, waits
    assert elapsed < 10 * (FB_S + STEP_S + 2 * THINK_S) + 0.3


def test_a_tenant_that_thinks_longer_than_the_window_is_not_waited_for():
    # b loads data for 0.2 s between calls: a must not wait for it.
    waits = run_clients(0.05, {"a": (12, 0.0), "b": (3, 0.0, 0.2)}).waits["a"]
    late = waits[6:]  # once b's think time is known
    # Waiting for b would hold a for the 50 ms window on every call; a loaded machine may
    # delay one call by itself (38 ms seen in CI beside other jobs), which is not a wait for b.
    assert sum(w >= 0.01 for w in late) <= 1, late


def test_no_gathering_when_disabled_or_when_nobody_is_expected():
    recorder = Recorder()

    async def main() -> float:
        scheduler = FairScheduler(recorder.single, recorder.fused, fuse_wait_s=0.5)
        try:
            # A tenant never seen before is not expected: the first call runs at once.
            started = time.monotonic()
            await scheduler.submit("a", "forward_backward", {})
            elapsed = time.monotonic() - started
            # busy_s (in /status) counts the worker's time running tasks: the one 20 ms pass
            # (added just after the caller's result is handed over, so it may lag a moment).
            for _ in range(100):
                if scheduler.busy_s:
                    break
                await asyncio.sleep(0.01)
            assert FB_S <= scheduler.busy_s <= time.monotonic() - started
            return elapsed
        finally:
            scheduler.close()

    assert asyncio.run(main()) < 0.5 * 0.5
    assert recorder.passes() == [("a",)]


def test_a_removed_tenant_leaves_nothing_behind():
    """Long-running servers see many tenants come and go: no per-tenant entry may outlive them."""
    recorder = Recorder()

    async def main() -> FairScheduler:
        scheduler = FairScheduler(recorder.single, recorder.fused, fuse_wait_s=0.02)
        try:
            await asyncio.gather(
                tenant_loop(scheduler, "a", 3, 0.0), tenant_loop(scheduler, "b", 3, 0.0)
            )
            assert set(scheduler._think_s) == {"a", "b"}  # learned while they trained
            assert scheduler._queues == {}  # emptied queues are dropped
            await scheduler.submit("a", "remove_adapter", {})
            assert set(scheduler._think_s) == set(scheduler._last_done) == {"b"}
            # "b" still trains normally, and a later call of "a" starts from scratch.
            await tenant_loop(scheduler, "b", 1, 0.0)
            assert await scheduler.submit("a", "forward_backward", {}) == "a"
        finally:
            scheduler.close()
        return scheduler

    asyncio.run(main())
    assert recorder.passes()[-1] == ("a",)
