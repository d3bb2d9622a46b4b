"""Adapter paging (twinkle/model/paging.py): max_resident adapters on the device as a cache."""

import errno

import pytest
import torch
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.paging import AdapterCapacityError

NAMES = ("a", "b", "c", "d", "e")


def _model(names=NAMES, gas=1, **paging) -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel("tiny://qwen3", torch_dtype=torch.float32, device="cpu")
    if paging:
        model.enable_paging(**paging)
    for i, name in enumerate(names):
        rank = 4 * (1 + i % 3)
        model.add_adapter_to_model(
            name,
            LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False),
            gradient_accumulation_steps=gas,
        )
        model.set_optimizer("AdamW", adapter_name=name, lr=1e-2)
        model.set_lr_scheduler("LinearLR", adapter_name=name, start_factor=1.0, end_factor=0.5)
    return model


def _round_robin(model, rounds=2, pairs=True) -> list[float]:
    """Each tenant alone, then pairs fused into one pass (two tenants page in together)."""
    losses = []
    for r in range(rounds):
        for i, name in enumerate(NAMES):
            out = model.forward_backward(make_batch(rows=2, seq=12, seed=100 * r + i), name)
            losses.append(out["loss"])
            model.clip_grad_and_step(0.5, adapter_name=name)
        if pairs:
            group = [NAMES[r % 5], NAMES[(r + 2) % 5]]
            outs = model.forward_backward_many(
                {
                    n: {"inputs": make_batch(rows=1, seq=10, seed=7 + r + j)}
                    for j, n in enumerate(group)
                }
            )
            losses.extend(outs[n]["loss"] for n in group)
            model.clip_grad_and_step_many(group, 0.5)
    return losses


def _assert_same_state(paged, plain):
    for name in NAMES:
        a, b = paged.adapter_state_dict(name), plain.adapter_state_dict(name)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), f"{name}: weights differ"
        sa = paged.tenants[name].optimizer.state_dict()
        sb = plain.tenants[name].optimizer.state_dict()
        assert sa["param_groups"] == sb["param_groups"]
        assert sa["state"].keys() == sb["state"].keys()
        for index, fields in sb["state"].items():
            for field, value in fields.items():
                assert torch.equal(sa["state"][index][field], value), f"{name}: {field} differs"
        ta, tb = paged.tenants[name], plain.tenants[name]
        assert (ta.cur_step, ta.micro_step) == (tb.cur_step, tb.micro_step)
        assert ta.scheduler.state_dict() == tb.scheduler.state_dict()


@pytest.mark.parametrize("mode", ["host", "storage"])
def test_paged_tenants_continue_bit_exactly_as_never_paged(mode, tmp_path):
    plain = _model()
    paged = _model(max_resident=2, mode=mode, storage_dir=tmp_path if mode == "storage" else None)
    assert _round_robin(paged) == _round_robin(plain)  # every loss equal, bit for bit
    pager = paged.pager
    assert pager.stats.page_outs >= 10 and pager.stats.page_ins >= 10
    assert len(pager.resident) <= 2 and len(pager.resident) + len(pager.paged) == len(NAMES)
    if mode == "storage":
        assert pager.stats.to_storage == pager.stats.page_outs
        assert len(list(tmp_path.iterdir())) == len(pager.paged)
    _assert_same_state(paged, plain)
    # A paged-out adapter's device memory is freed.
    victim = next(iter(pager.paged))
    assert all(p.numel() == 0 for p in paged.tenants[victim].params)


def test_mid_accumulation_adapter_is_never_paged_out():
    model = _model(names=("a", "b", "c"), gas=2, max_resident=2)
    model.forward_backward(make_batch(rows=2, seq=12), "a")
    model.clip_grad_and_step(adapter_name="a")  # 1 of 2 micro-steps: accumulating
    assert model.pager.is_busy(model.tenants["a"])
    model.forward_backward(make_batch(rows=2, seq=12, seed=1), "b")
    model.clip_grad_and_step(adapter_name="b")
    # c needs a slot: b is mid-accumulation too, so nothing can go and nothing changes.
    with pytest.raises(AdapterCapacityError, match="busy"):
        model.forward_backward(make_batch(rows=2, seq=12, seed=2), "c")
    assert set(model.pager.resident) == {"a", "b"} and "c" in model.pager.paged
    model.forward_backward(make_batch(rows=2, seq=12, seed=3), "b")
    assert model.clip_grad_and_step(adapter_name="b") is True  # b's window closes: idle
    model.forward_backward(make_batch(rows=2, seq=12, seed=2), "c")
    assert "b" in model.pager.paged and "a" in model.pager.resident


def test_queued_adapter_reported_busy_is_never_paged_out():
    queued = {"a"}
    model = _model(names=("a", "b", "c"), max_resident=2, busy=lambda n: n in queued)
    # a is least recently used but the caller has a call of it queued: b goes instead.
    model.forward_backward(make_batch(rows=2, seq=12), "c")
    assert model.pager.paged.keys() == {"b"}
    queued.clear()
    model.clip_grad_and_step(adapter_name="c")
    model.forward_backward(make_batch(rows=2, seq=12), "b")
    assert model.pager.paged.keys() == {"a"}


def test_one_call_for_more_adapters_than_fit_is_a_capacity_error():
    model = _model(names=("a", "b", "c"), max_resident=2)
    before = {n: model.adapter_state_dict(n) for n in ("b", "c")}
    with pytest.raises(AdapterCapacityError, match="more than the 2"):
        model.forward_backward_many({n: {"inputs": make_batch(rows=1)} for n in ("a", "b", "c")})
    assert not any(t.pending_grads for t in model.tenants.values())
    for name, state in before.items():
        assert all(torch.equal(v, model.adapter_state_dict(name)[k]) for k, v in state.items())


def test_host_bound_spills_to_storage_or_is_a_capacity_error(tmp_path):
    bounded = _model(names=("a",), max_resident=1, max_host_bytes=1)
    with pytest.raises(AdapterCapacityError, match="no paging storage"):
        bounded.add_adapter_to_model("b", LoraConfig(r=4))
    assert bounded.list_adapters() == ["a"] and not bounded.pager.paged
    assert bounded.tenants["a"].params[0].numel() > 0  # a stays resident, untouched
    spill = _model(names=("a", "b", "c"), max_resident=1, max_host_bytes=1, storage_dir=tmp_path)
    assert spill.pager.stats.to_storage == 2 and spill.pager.host_bytes == 0


def test_full_storage_is_a_capacity_error_and_keeps_the_adapter(tmp_path, monkeypatch):
    model = _model(names=("a", "b"), max_resident=2, mode="storage", storage_dir=tmp_path)
    expected = model.adapter_state_dict("a")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(AdapterCapacityError, match="full"):
        model.add_adapter_to_model("c", LoraConfig(r=4))
    assert "c" not in model.tenants and set(model.pager.resident) == {"a", "b"}
    assert list(tmp_path.iterdir()) == []
    got = model.adapter_state_dict("a")
    assert all(torch.equal(v, got[k]) for k, v in expected.items())


def test_removing_a_paged_adapter_frees_its_storage(tmp_path):
    model = _model(names=("a", "b", "c"), max_resident=1, mode="storage", storage_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2
    model.remove_adapter("a")
    assert len(list(tmp_path.iterdir())) == 1 and "a" not in model.pager.paged
    assert model.list_adapters() == ["b", "c"]
