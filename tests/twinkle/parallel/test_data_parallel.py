"""dp_size 2 on CPU (two gloo workers): a step equals one model's step on the combined batch;
a worker killed mid-call fails the call clearly and ``recover`` reloads from checkpoints."""

import concurrent.futures
import time

import pytest
import torch
from peft import LoraConfig
from safetensors.torch import load_file

import twinkle
from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel
from twinkle.parallel import AdapterLostError, DeviceGroup, WorkerLostError

pytestmark = pytest.mark.integration

MODEL = "tiny://qwen3"


@pytest.fixture(scope="module")
def ray_context():
    context = twinkle.initialize(
        mode="ray", groups=[DeviceGroup("dp", ranks=2, device_type="cpu", num_cpus=0.5)]
    )
    try:
        yield context
    finally:
        context.shutdown()


@pytest.fixture(scope="module")
def dp(ray_context):
    from twinkle.parallel import DataParallelModel

    model = DataParallelModel(MODEL, dp_size=2, device_group="dp")
    yield model
    model.shutdown()


@pytest.fixture(scope="module")
def single():
    return MultiLoraTransformersModel(MODEL)


def _add(models, name, rank, loss=None, **loss_kwargs):
    for model in models:
        model.add_adapter_to_model(
            name, LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False)
        )
        model.set_optimizer("SGD", lr=0.5, adapter_name=name)
        if loss:
            model.set_loss(loss, adapter_name=name, **loss_kwargs)


def _grpo_request(rows=3, seq=20):
    inputs = make_batch(rows=rows, seq=seq, seed=2)
    inputs["attention_mask"][-1, seq - 5 :] = 0  # a shorter row: shards see different token counts
    inputs["labels"][-1, seq - 5 :] = -100
    generator = torch.Generator().manual_seed(5)
    return {
        "inputs": inputs,
        "advantages": torch.linspace(1.0, -1.0, rows),
        "old_logprobs": -8.3 + 0.05 * torch.randn(rows, seq, generator=generator),
    }


def _assert_same_adapter(dp, single, name):
    got, expected = dp.adapter_state_dict(name), single.adapter_state_dict(name)
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-7)


def _grads(model, name):
    return model.replicas.call(
        "apply", lambda m, n: [p.grad.clone() for p in m.tenants[n].params], name
    )


def test_one_tenant_step_equals_the_combined_batch(dp, single):
    _add((dp, single), "ce", rank=4)
    batch = make_batch(rows=5, seq=16, seed=1)  # 5 rows: ranks get 3 and 2
    batch["labels"][
        0, 4:12
    ] = -100  # unequal token counts per rank: the token mean needs global counts
    got = dp.forward_backward(batch, adapter_name="ce")
    expected = single.forward_backward(batch, adapter_name="ce")
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert got["num_tokens"] == expected["num_tokens"]
    assert len(got["logprobs"]) == 5
    for row_got, row_expected in zip(got["logprobs"], expected["logprobs"]):
        torch.testing.assert_close(
            torch.tensor(row_got), torch.tensor(row_expected), rtol=1e-5, atol=1e-6
        )
    rank0, rank1 = _grads(dp, "ce")
    for g0, g1, g in zip(rank0, rank1, [p.grad for p in single.tenants["ce"].params]):
        torch.testing.assert_close(g0, g1, rtol=0, atol=0)  # all-reduced: identical on every rank
        # 1e-5 relative to the gradient's scale: shards sum in a different order than one batch
        torch.testing.assert_close(g0, g, rtol=1e-5, atol=1e-5 * float(g.abs().max()))
    assert (
        dp.clip_grad_and_step(adapter_name="ce")
        is single.clip_grad_and_step(adapter_name="ce")
        is True
    )
    _assert_same_adapter(dp, single, "ce")
    metric, expected_metric = (
        dp.calculate_metric(adapter_name="ce").result,
        single.calculate_metric(adapter_name="ce").result,
    )
    assert metric["loss"] == pytest.approx(expected_metric["loss"], rel=1e-5)
    assert (metric["num_tokens"], metric["step"]) == (expected_metric["num_tokens"], 1)


def test_fused_two_tenant_batch_with_ce_and_grpo(dp, single):
    _add((dp, single), "sft", rank=4)
    _add((dp, single), "rl", rank=8, loss="GRPOLoss", epsilon=0.2)
    for step in range(2):  # two steps: optimizer state stays identical across ranks too
        requests = {
            "sft": {"inputs": make_batch(rows=4, seq=12, seed=10 + step)},
            "rl": _grpo_request(),
        }
        got = dp.forward_backward_many(requests)
        expected = single.forward_backward_many(
            {"sft": {"inputs": make_batch(rows=4, seq=12, seed=10 + step)}, "rl": _grpo_request()}
        )
        for name in ("sft", "rl"):
            assert got[name]["loss"] == pytest.approx(expected[name]["loss"], rel=1e-5, abs=1e-7)
            assert got[name]["num_tokens"] == expected[name]["num_tokens"]
            dp.clip_grad_and_step(adapter_name=name)
            single.clip_grad_and_step(adapter_name=name)
            _assert_same_adapter(dp, single, name)
            dp.check_replicas(name)


def test_upstream_dpo_flow_keeps_pairs_whole_and_reference_rows_aligned(dp, single):
    """ModelScope Twinkle's DPO script: a reference pass with the adapter off, then a training
    pass with its result as ``ref_outputs``. The replicas get whole pairs and the reference
    rows that belong to them; the step equals one model's."""
    _add((dp, single), "pref", rank=4, loss="SimPOLoss")
    for model in (dp, single):
        model.set_loss("DPOLoss", adapter_name="pref", beta=0.1, reference_free=False)
    batch = make_batch(rows=6, seq=14, seed=7)  # 3 pairs: ranks get 2 and 1 pairs
    refs = [m.forward_only(batch, adapter_name="pref", disable_lora=True) for m in (dp, single)]
    assert "loss" not in refs[0] and refs[0].result is refs[0]
    for got, expected in zip(refs[0]["logprobs"], refs[1]["logprobs"]):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-6)
    got = dp.forward_backward(batch, adapter_name="pref", ref_outputs=refs[0].result)
    expected = single.forward_backward(batch, adapter_name="pref", ref_outputs=refs[1].result)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    dp.clip_grad_and_step(adapter_name="pref")
    single.clip_grad_and_step(adapter_name="pref")
    _assert_same_adapter(dp, single, "pref")


def test_a_tenant_with_fewer_rows_than_ranks(dp, single):
    _add((dp, single), "one", rank=4)
    batch = make_batch(rows=1, seq=10, seed=7)  # rank 1 gets no row and still joins the all-reduce
    assert dp.forward_backward(batch, adapter_name="one")["loss"] == pytest.approx(
        single.forward_backward(batch, adapter_name="one")["loss"], rel=1e-5
    )
    dp.clip_grad_and_step(adapter_name="one")
    single.clip_grad_and_step(adapter_name="one")
    _assert_same_adapter(dp, single, "one")


def test_a_bad_request_fails_on_every_rank_and_rolls_back(dp):
    _add((dp,), "bad", rank=4)
    batch = make_batch(rows=2, seq=10, seed=3)
    batch["input_ids"][1, 3] = 10**7  # out of the vocabulary on rank 1 only
    with pytest.raises(ValueError, match="vocabulary"):
        dp.forward_backward(batch, adapter_name="bad")
    assert dp.replicas.call("apply", lambda m: m.tenants["bad"].pending_grads) == [False, False]


def test_sampler_requests_spread_over_replicas(ray_context):
    from twinkle.parallel import DataParallelSampler

    class EchoSampler:
        def __init__(self, model_id):
            import os

            self.pid = os.getpid()

        def sample(self, inputs, delay=0.0):
            time.sleep(delay)
            return {"pid": self.pid, "inputs": inputs}

    sampler = DataParallelSampler(EchoSampler, dp_size=2, num_cpus=0.1, model_id=MODEL)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda i: sampler.sample(i, delay=0.5), range(4)))
        assert [r["inputs"] for r in results] == [0, 1, 2, 3]
        assert len({r["pid"] for r in results}) == 2
        assert sampler.served == [2, 2]
    finally:
        sampler.shutdown()


def test_killed_worker_fails_pending_calls_and_recover_reloads_checkpoints(dp, tmp_path):
    import ray

    _add((dp,), "kept", rank=4)
    _add((dp,), "unsaved", rank=4)
    dp.forward_backward(make_batch(rows=2, seq=10, seed=1), adapter_name="kept")
    dp.clip_grad_and_step(adapter_name="kept")
    path = dp.save("step-1", output_dir=tmp_path, save_optimizer=True, adapter_name="kept")
    dp.forward_backward(make_batch(rows=2, seq=10, seed=2), adapter_name="kept")
    dp.clip_grad_and_step(adapter_name="kept")  # trained past the checkpoint: that step is lost

    busy = dp.replicas.actors[1].apply.remote(
        lambda m: time.sleep(60)
    )  # rank 1 can't start the call
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            dp.forward_backward, make_batch(rows=2, seq=10, seed=3), adapter_name="kept"
        )
        time.sleep(0.5)
        ray.kill(dp.replicas.actors[1], no_restart=True)
        with pytest.raises(WorkerLostError, match="rank 1") as lost:
            pending.result(timeout=60)
    assert lost.value.rank == 1
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(busy)
    with pytest.raises(WorkerLostError, match="recover"):
        dp.forward_backward(make_batch(rows=2, seq=10, seed=3), adapter_name="kept")

    report = dp.recover()
    assert report["reloaded"] == {"kept": path}
    assert "unsaved" in report["lost"]
    saved = load_file(f"{path}/adapter_model.safetensors")
    for state in dp.replicas.call("call", "adapter_state_dict", adapter_name="kept"):
        for key, value in saved.items():
            torch.testing.assert_close(state[key], value, rtol=0, atol=0)
    assert dp.calculate_metric(adapter_name="kept").result["step"] == 1
    with pytest.raises(AdapterLostError, match="unsaved"):
        dp.forward_backward(make_batch(rows=2, seq=10, seed=3), adapter_name="unsaved")
    dp.forward_backward(make_batch(rows=2, seq=10, seed=3), adapter_name="kept")
    assert dp.clip_grad_and_step(adapter_name="kept") is True
    dp.add_adapter_to_model("unsaved", LoraConfig(r=4, lora_alpha=8))
    assert "unsaved" in dp.list_adapters()
