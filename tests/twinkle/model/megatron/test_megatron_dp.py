"""Data parallel megatron (dp=2: two Ray replicas over gloo) equals one transformers model."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch  # noqa: E402

from tests.twinkle.model.megatron._equivalence import TENANTS, assert_rel_close, make_batch  # noqa: E402


def train(model):
    """Two tenants of different ranks, two forward_backward + clipped Adam steps each."""
    for name, (r, seed) in TENANTS.items():
        config = {"r": r, "lora_alpha": 2 * r, "target_modules": "all-linear"}
        model.add_adapter_to_model(name, {**config, "init_lora_weights": False}, seed=seed)
        model.set_optimizer("Adam", adapter_name=name, lr=1e-2, eps=1.0)  # eps: see tp test
    batch_a = make_batch(3, 12, 1)  # 3 rows: the ranks get 2 and 1
    batch_a["labels"][0, 3:9] = -100  # unequal token counts: the mean needs global counts
    batches = {"a": batch_a, "b": make_batch(2, 10, 2)}
    losses = []
    for _ in range(2):
        for name, batch in batches.items():
            losses.append(model.forward_backward(batch, adapter_name=name)["loss"])
            assert model.clip_grad_and_step(max_grad_norm=0.5, adapter_name=name)
    return losses, {n: model.adapter_state_dict(adapter_name=n) for n in TENANTS}


@pytest.mark.slow
def test_dp2_equals_the_transformers_backend():
    import twinkle
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.parallel import DataParallelModel, DeviceGroup

    ref_losses, ref_states = train(MultiLoraTransformersModel("tiny://qwen3"))
    context = twinkle.initialize(
        mode="ray", groups=[DeviceGroup("dp", ranks=2, device_type="cpu", num_cpus=0.5)]
    )
    try:
        dp = DataParallelModel(
            "tiny://qwen3", dp_size=2, device_group="dp", model_backend="megatron"
        )
        try:
            kinds = dp.replicas.call("apply", lambda m: type(m).__name__)
            assert kinds == ["MultiLoraMegatronModel"] * 2
            losses, states = train(dp)
        finally:
            dp.shutdown()
    finally:
        context.shutdown()
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    for name in TENANTS:
        assert set(states[name]) == set(ref_states[name])
        for key, want in ref_states[name].items():
            assert_rel_close(torch.as_tensor(states[name][key]), want)
