"""FairScheduler sizes: a small call is never fused with a large one and waits at most one.

Issue 47 item 13: a tenant's 16-token call fused with another tenant's 32 x 500-token batch
waited for the whole batch (2-25 s instead of ~0.3 s alone). These tests drive the scheduler's
choice of the next batch directly (no threads, no clock), so they are deterministic.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from types import SimpleNamespace

import pytest

from twinkle.server.model.scheduler import FairScheduler, Task, payload_tokens

pytestmark = pytest.mark.unit
FB = "forward_backward"
LARGE, SMALL = 32 * 500, 16


def scheduler(**kwargs) -> FairScheduler:
    kwargs.setdefault("fuse_wait_s", 0.0)
    return FairScheduler(lambda t: None, lambda ts: [None] * len(ts), **kwargs)


def queue(s: FairScheduler, loop, tenant: str, size: int, kind: str = FB) -> Task:
    """Queue a task the way ``submit`` does, without running anything."""
    task = Task(tenant, kind, None, loop.create_future(), size=size)
    s._queues.setdefault(tenant, deque()).append(task)
    return task


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def picks(s: FairScheduler) -> list[tuple[str, ...]]:
    """Every batch the scheduler would run, in order, until nothing is queued."""
    out = []
    while True:
        batch, _ = s._next_batch(0.0)
        if not batch:
            return out
        out.append(tuple(t.tenant for t in batch))


def test_a_small_call_is_not_fused_with_a_large_one_and_goes_first(loop):
    s = scheduler()
    for _ in range(3):
        queue(s, loop, "large", LARGE)
    queue(s, loop, "small", SMALL)
    # Before sizes: [("large", "small"), ("large",), ("large",)]: the small call waited for
    # the whole large batch.
    assert picks(s) == [("small",), ("large",), ("large",), ("large",)]


def test_without_the_size_rule_every_head_fuses(loop):
    s = scheduler(group_tokens=0)
    queue(s, loop, "large", LARGE)
    queue(s, loop, "small", SMALL)
    assert picks(s) == [("large", "small")]


def test_calls_of_one_size_class_still_fuse(loop):
    s = scheduler(max_fused=8)
    for tenant, size in [("a", 500), ("b", 300), ("c", 16), ("d", 40)]:
        queue(s, loop, tenant, size)
    assert picks(s) == [("a", "b", "c", "d")]  # 856 tokens <= group_tokens
    s = scheduler(max_fused=8)
    for tenant in "abcd":
        queue(s, loop, tenant, 4000)  # large alike: 16000 <= 4 x 4000
    assert picks(s) == [("a", "b", "c", "d")]


def test_with_a_large_tenant_streaming_a_small_call_starts_within_one_pass(loop):
    # The large tenant always has its next call queued; small calls arrive at random points
    # (fixed seed). Each small call runs in the first batch chosen after it arrives: alone, or
    # beside a large call only when that call had already given its turn to a small group (it
    # would have waited for that call anyway, so it rides along instead of waiting twice).
    rng = random.Random(47)
    s = scheduler()
    queue(s, loop, "large", LARGE)
    waited, alone = [], 0
    for _ in range(200):
        arrived = None
        if rng.random() < 0.4 and not s.depth("small"):
            arrived = queue(s, loop, "small", rng.choice([8, 16, 64, 200]))
        batch, _ = s._next_batch(0.0)
        if not s.depth("large"):
            queue(s, loop, "large", LARGE)
        if arrived is not None:
            waited.append(arrived in batch)
            large = [t for t in batch if t.tenant == "large"]
            assert not large or large[0].yielded
            alone += not large
    assert len(waited) > 50 and all(waited)
    assert alone >= len(waited) // 2, (alone, len(waited))


def test_a_large_call_yields_to_at_most_one_small_group(loop):
    # Eight small tenants that always have a call queued cannot starve the large one.
    s = scheduler(max_fused=4)
    queue(s, loop, "large", LARGE)
    small = [f"s{i}" for i in range(8)]
    for tenant in small:
        queue(s, loop, tenant, SMALL)
    order = []
    for _ in range(6):
        batch, _ = s._next_batch(0.0)
        order.append(tuple(t.tenant for t in batch))
        for t in batch:
            if t.tenant != "large":
                queue(s, loop, t.tenant, SMALL)
    assert order[0] == ("s0", "s1", "s2", "s3")  # the small group first, once
    assert order[1][0] == "large"  # then the large call, with small ones riding along


def test_gathering_does_not_wait_for_a_tenant_whose_calls_are_large(loop):
    s = scheduler(fuse_wait_s=0.05)
    now = 100.0
    for tenant, size in [("large", LARGE), ("peer", SMALL)]:
        s._last_done[tenant], s._think_s[tenant], s._size[tenant] = now, 0.003, size
    queue(s, loop, "small", SMALL).enqueued_at = now
    batch, until = s._next_batch(now)
    assert batch == [] and until is not None  # waits, but only for the small peer
    s._last_done.pop("peer")
    batch, _ = s._next_batch(now)
    assert [t.tenant for t in batch] == ["small"]  # the large tenant is not waited for


def test_the_size_of_a_service_job_is_its_input_tokens():
    request = SimpleNamespace(inputs=[{"input_ids": [1] * 10}, {"input_ids": [2] * 6}])
    assert payload_tokens(SimpleNamespace(request=request)) == 16
    assert payload_tokens(SimpleNamespace(request=SimpleNamespace())) == 0


def test_submit_sizes_fusable_calls():
    seen = []

    def fused(tasks):
        seen.append([(t.tenant, t.size) for t in tasks])
        return [None] * len(tasks)

    async def main():
        s = FairScheduler(lambda t: seen.append([(t.tenant, t.size)]), fused, fuse_wait_s=0)
        job = SimpleNamespace(request=SimpleNamespace(inputs=[{"input_ids": [1] * 7}]))
        await s.submit("a", FB, job)
        s.close()

    asyncio.run(main())
    assert seen == [[("a", 7)]]
