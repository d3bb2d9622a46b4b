"""max_loras as a cache: the server pages idle adapters out and back (twinkle/model/paging.py)."""

import asyncio

import numpy as np
import pytest

from twinkle.server.testing import (  # tests/twinkle_server/conftest.py puts it on the path
    client,
    local_server,
)

MODEL = "/api/v1/model/tiny/qwen3"
TENANTS = [
    ("alice", "a1"),
    ("alice", "a2"),
    ("alice", "a3"),
    ("bob", "b1"),
    ("bob", "b2"),
    ("bob", "b3"),
]


def _features(seed=0, rows=2, seq=12):
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 4000, size=(rows, seq)).tolist()
    return [{"input_ids": r, "labels": [-100] * 3 + r[3:]} for r in ids]


async def _post(http, op, **body):
    r = await http.post(f"{MODEL}/{op}", json=body)
    return r


async def _add(http, name):
    r = await _post(
        http, "add_adapter_to_model", adapter_name=name, config={"r": 4, "lora_alpha": 8}
    )
    if r.status_code == 200:
        r = await _post(http, "set_optimizer", adapter_name=name, optimizer="AdamW", lr=1e-2)
    return r


async def _train_in_turn(server, rounds):
    """Every tenant one forward_backward + step per round, in turn; returns the losses."""
    losses = []
    async with client(server, "alice") as alice, client(server, "bob") as bob:
        http = {"alice": alice, "bob": bob}
        for who, name in TENANTS:
            r = await _add(http[who], name)
            assert r.status_code == 200, r.text
        for step in range(rounds):
            for i, (who, name) in enumerate(TENANTS):
                r = await _post(
                    http[who],
                    "forward_backward",
                    adapter_name=name,
                    inputs=_features(10 * step + i),
                )
                assert r.status_code == 200, r.text
                losses.append(r.json()["result"]["loss"])
                r = await _post(http[who], "clip_grad_and_step", adapter_name=name)
                assert r.status_code == 200, r.text
    return losses


def test_three_times_max_loras_tenants_train_in_turn_exactly(tmp_path):
    paged = local_server(tmp_path / "paged", max_loras=2)
    plain = local_server(tmp_path / "plain", max_loras=8, adapter_paging="off")
    losses = asyncio.run(_train_in_turn(paged, rounds=2))
    assert losses == asyncio.run(_train_in_turn(plain, rounds=2))  # bit-exact, loss by loss
    service = paged.services["model"]
    pager = service.model.pager
    assert len(pager.resident) == 2 and len(pager.paged) == 4
    assert pager.stats.page_ins >= 10
    for tenant in service.model.tenants.values():
        assert tenant.cur_step == 2  # exact step counts: nothing lost, nothing doubled
    status = service.status()
    assert status["adapters"] == 6 and status["paging"]["paged"] == 4


def test_capacity_error_only_past_max_paged_adapters_or_with_paging_off(tmp_path):
    async def scenario(server, allowed):
        async with client(server, "alice") as alice, client(server, "bob") as bob:
            http = [alice, alice, alice, bob]
            for i in range(allowed):
                assert (await _add(http[i], f"x{i}")).status_code == 200
            r = await _add(http[allowed], f"x{allowed}")
            return r

    r = asyncio.run(scenario(local_server(tmp_path / "off", max_loras=2, adapter_paging="off"), 2))
    assert r.status_code == 503 and "max_loras=2" in r.text
    bounded = local_server(tmp_path / "bounded", max_loras=2, max_paged_adapters=1)
    r = asyncio.run(scenario(bounded, 3))
    assert r.status_code == 503 and "max_paged_adapters=1" in r.text
    assert len(bounded.services["model"].model.tenants) == 3  # the refused one left nothing


def test_adapters_with_queued_calls_or_pending_grads_are_never_paged_out(tmp_path):
    server = local_server(tmp_path, max_loras=2)
    service = server.services["model"]
    violations, outs = [], []

    async def scenario():
        async with client(server, "alice") as alice, client(server, "bob") as bob:
            http = {"alice": alice, "bob": bob}
            for who, name in TENANTS:
                assert (await _add(http[who], name)).status_code == 200
            pager = service.model.pager
            original = pager.page_out

            def watched(tenant):
                if service.scheduler.depth(tenant.name) or tenant.pending_grads:
                    violations.append(tenant.name)
                outs.append(tenant.name)
                original(tenant)

            pager.page_out = watched

            async def chain(who, name, seed):
                for step in range(2):
                    for op, body in (
                        ("forward_backward", {"inputs": _features(seed + step)}),
                        ("clip_grad_and_step", {}),
                    ):
                        while True:  # a 503 (no idle slot) is retried, as clients do
                            r = await _post(http[who], op, adapter_name=name, **body)
                            if r.status_code != 503:
                                break
                            await asyncio.sleep(0.01)
                        assert r.status_code == 200, r.text

            await asyncio.gather(*(chain(w, n, i) for i, (w, n) in enumerate(TENANTS)))

    asyncio.run(scenario())
    assert outs and violations == []
    assert all(t.cur_step == 2 for t in service.model.tenants.values())


@pytest.mark.parametrize("bad", ["disk", 3])
def test_bad_adapter_paging_value_is_refused_by_name(tmp_path, bad):
    with pytest.raises(Exception, match="adapter_paging"):
        local_server(tmp_path, adapter_paging=bad)
