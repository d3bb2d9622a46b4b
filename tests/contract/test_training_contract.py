"""One behavioural contract, run twice: on local ``twinkle`` and through ``twinkle_client``.

Every test takes ``ns`` (see conftest) and uses only the mirrored API, so a pass on both backends
means a script behaves the same whether it trains in-process or on a server.
"""

from __future__ import annotations

import numpy as np
import pytest
from serving import MODEL_ID, TEMPLATE

LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}


def features(seed: int = 0, rows: int = 2, length: int = 12) -> list[dict]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 2000, size=(rows, length))
    return [{"input_ids": row, "labels": np.concatenate([[-100] * 3, row[3:]])} for row in ids]


def trajectories(ns, n: int = 2):
    Message, Trajectory = ns.data_format.Message, ns.data_format.Trajectory
    return [
        Trajectory(
            messages=[
                Message(role="user", content=f"What is {i} plus {i}?"),
                Message(role="assistant", content=f"It is {2 * i}."),
            ]
        )
        for i in range(n)
    ]


def new_adapter(model, name: str, lr: float = 1e-2) -> None:
    model.add_adapter_to_model(name, dict(LORA))
    model.set_template(TEMPLATE, adapter_name=name)
    model.set_optimizer("Adam", adapter_name=name, lr=lr)


def test_sft_loss_decreases(ns):
    model = ns.model_for("alice")
    new_adapter(model, "sft")
    batch = trajectories(ns)
    losses = []
    for _ in range(6):
        losses.append(model.forward_backward(inputs=batch, adapter_name="sft")["loss"])
        assert model.clip_grad_and_step(adapter_name="sft") is True
    assert losses[-1] < 0.7 * losses[0], losses
    metric = model.calculate_metric(is_training=True, adapter_name="sft")
    assert metric.result["step"] == 6 and metric.result["loss"] is not None
    configs = model.get_train_configs(adapter_name="sft").model_dump()
    assert configs["lora"]["r"] == 8 and configs["optimizer"]["name"] == "Adam"


def test_save_and_resume_continue_exactly(ns):
    model = ns.model_for("alice")
    new_adapter(model, "default")
    batches = [features(seed) for seed in range(4)]
    for batch in batches[:2]:
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
    path = model.save("mid", save_optimizer=True, consumed_train_samples=4)
    expected = []
    for batch in batches[2:]:
        expected.append(model.forward_backward(inputs=batch)["loss"])
        model.clip_grad_and_step()

    model.remove_adapter("default")
    new_adapter(model, "default")
    progress = model.resume_from_checkpoint(path)
    assert progress["cur_step"] == 2 and progress["consumed_train_samples"] == 4
    resumed = []
    for batch in batches[2:]:
        resumed.append(model.forward_backward(inputs=batch)["loss"])
        model.clip_grad_and_step()
    np.testing.assert_allclose(resumed, expected, rtol=1e-5, atol=1e-6)


def test_other_tenants_are_untouched(ns):
    model_a, model_b = ns.model_for("alice"), ns.model_for("bob")
    new_adapter(model_a, "a", lr=5e-2)
    new_adapter(model_b, "b")
    probe = features(seed=7)
    before = model_b.forward_only(inputs=probe, adapter_name="b")
    for seed in range(3):
        model_a.forward_backward(inputs=features(seed), adapter_name="a")
        model_a.clip_grad_and_step(adapter_name="a")
    after = model_b.forward_only(inputs=probe, adapter_name="b")
    assert model_a.forward_only(inputs=probe, adapter_name="a")["loss"] != pytest.approx(
        before["loss"]
    )
    assert after["loss"] == pytest.approx(before["loss"], rel=1e-6)
    np.testing.assert_allclose(
        np.concatenate(after["logprobs"]), np.concatenate(before["logprobs"]), rtol=1e-5
    )


def test_sampling_with_a_saved_adapter(ns):
    target = [101, 202, 303, 404]
    prompt = [11, 12, 13, 14, 15]
    model = ns.model_for("alice")
    new_adapter(model, "sampled", lr=1e-2)
    sample = {"input_ids": prompt + target, "labels": [-100] * len(prompt) + target}
    for _ in range(30):
        model.forward_backward(inputs=[sample], adapter_name="sampled")
        model.clip_grad_and_step(adapter_name="sampled")
    path = model.save("memorised", adapter_name="sampled")

    sampler = ns.sampler.TorchSampler(model_id=MODEL_ID)
    sampler.set_template(TEMPLATE)
    greedy = {"max_tokens": len(target), "temperature": 0.0}
    tuned = sampler.sample(inputs=[prompt], sampling_params=greedy, adapter_uri=path)
    base = sampler.sample(inputs=[prompt], sampling_params=greedy)
    assert type(tuned).__name__ == "SampleResponse" and type(tuned[0]).__name__ == "SampleResult"
    assert tuned[0].sequences[0].tokens == target
    assert base[0].sequences[0].tokens != target
    # A single-sequence result is a training sample: the trainer scores it as the sampler did.
    scored = model.forward_only(inputs=tuned, adapter_name="sampled")
    completion_logprobs = np.asarray(scored["logprobs"][0])[-len(target) :]
    np.testing.assert_allclose(completion_logprobs, tuned[0].sequences[0].logprobs, atol=1e-3)


def test_dataloader_resume_yields_exactly_the_unseen_samples(ns):
    meta = ns.dataset.DatasetMeta("builtin://self-cognition", data_slice=range(10))
    dataset = ns.dataset.Dataset(dataset_meta=meta)
    dataset.set_template(TEMPLATE, model_id=MODEL_ID, max_length=256)
    dataset.map(
        "SelfCognitionProcessor", init_args={"model_name": "Twinkle", "model_author": "ModelScope"}
    )
    dataset.encode(batched=True)
    assert len(dataset) == 10 and set(dataset.column_names) >= {"input_ids", "labels"}

    def ids(batch):
        return [sample["input_ids"].tolist() for sample in batch]

    full = [
        ids(b)
        for b in ns.dataloader.DataLoader(dataset=dataset, batch_size=3, shuffle=True, seed=5)
    ]
    first = ns.dataloader.DataLoader(dataset=dataset, batch_size=3, shuffle=True, seed=5)
    seen = []
    for batch in first:
        seen.append(ids(batch))
        if len(seen) == 2:
            break
    state = first.get_state()
    assert state["consumed_train_samples"] == 6

    resumed = ns.dataloader.DataLoader(dataset=dataset, batch_size=3, shuffle=True, seed=5)
    resumed.resume_from_checkpoint(state["consumed_train_samples"])
    rest = [ids(b) for b in resumed]
    assert seen + rest == full
    assert sorted(x for b in seen + rest for x in map(tuple, b)) == sorted(
        tuple(dataset[i]["input_ids"].tolist()) for i in range(10)
    )
