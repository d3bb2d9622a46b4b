"""Under tensor parallel each rank keeps its chunk of every tenant's Adam moments (tp=2, gloo,
fp32 on CPU): several steps equal the transformers backend, each rank holds half the state, and a
checkpoint's optimizer state is the one-process format both ways."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch  # noqa: E402

from tests.twinkle.model.megatron._equivalence import TENANTS, assert_rel_close, make_batch  # noqa: E402
from twinkle.errors import InvalidArgumentError  # noqa: E402

STEPS = 3


def _setup(model):
    for name, (r, seed) in TENANTS.items():
        config = {"r": r, "lora_alpha": 2 * r, "target_modules": "all-linear"}
        model.add_adapter_to_model(name, {**config, "init_lora_weights": False}, seed=seed)
        # AdamW with weight decay, several steps: the moments of step 1 decide step 2+. eps=1
        # as in _equivalence.py: with the default eps the update is about lr*sign(g), which
        # turns tp's reduction-order rounding into 1e-4-level weight differences.
        model.set_optimizer("AdamW", adapter_name=name, lr=1e-2, eps=1.0, weight_decay=0.1)


def _batches():
    return {
        "a": {"inputs": make_batch(3, 12, 1)},
        "b": {"inputs": make_batch(2, 10, 2)},
    }


def _train(model, steps=STEPS):
    losses = []
    for _ in range(steps):
        out = model.forward_backward_many(_batches())
        losses += [out[n]["loss"] for n in TENANTS]
        model.clip_grad_and_step_many(list(TENANTS), max_grad_norm=0.5)
    return losses


def _moments(path):
    state = torch.load(f"{path}/optimizer.pt", weights_only=False)
    return state, [state["state"][i] for i in sorted(state["state"])]


def test_tp2_sharded_adam_equals_one_process_and_checkpoints_both_ways(tmp_path):
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    ref = MultiLoraTransformersModel("tiny://qwen3")
    _setup(ref)
    ref_losses = _train(ref)
    ref_dir = ref.save(
        "ref", output_dir=str(tmp_path / "ref"), save_optimizer=True, adapter_name="b"
    )
    ref_state, ref_moments = _moments(ref_dir)
    per_tenant = sum(p.numel() for p in ref.tenant("b").params)

    with ParallelMegatronModel("tiny://qwen3", tp_size=2, launcher="process") as tp2:
        _setup(tp2)
        assert tp2.optimizer_state_numel(adapter_name="b") == [0, 0]  # no step yet
        losses = _train(tp2)
        assert losses == pytest.approx(ref_losses, rel=1e-4)
        assert ref_losses[-1] < ref_losses[1]  # the steps moved the adapters
        # Each rank: its half of the moments (two of them), not the whole adapter's.
        numels = tp2.optimizer_state_numel(adapter_name="b")
        assert sum(numels) == 2 * per_tenant and max(numels) <= 2 * -(-per_tenant // 2)
        for name in TENANTS:
            got = tp2.adapter_state_dict(adapter_name=name)
            for key, want in ref.adapter_state_dict(adapter_name=name).items():
                assert_rel_close(got[key], want)

        # Saved under tp: the one-process format, whole moments equal to the reference's.
        saved = tp2.save(
            "tp", output_dir=str(tmp_path / "tp"), save_optimizer=True, adapter_name="b"
        )
        state, moments = _moments(saved)
        assert len(moments) == len(ref_moments) and state["param_groups"][0]["params"] == list(
            range(len(ref_moments))
        )
        assert (
            state["param_groups"][0]["weight_decay"] == ref_state["param_groups"][0]["weight_decay"]
        )
        for got, want in zip(moments, ref_moments):
            assert float(got["step"]) == float(want["step"]) == STEPS
            for key in ("exp_avg", "exp_avg_sq"):
                assert got[key].shape == want[key].shape
                assert_rel_close(got[key], want[key])
        # A refused save fails on every rank alike (no rank left in the gather): the next works.
        with pytest.raises(InvalidArgumentError, match="invalid checkpoint name"):
            tp2.save("../x", output_dir=str(tmp_path / "tp"), save_optimizer=True, adapter_name="b")

        # The reference's checkpoint resumed under tp (each rank keeps its chunk), and the tp
        # checkpoint resumed by the transformers backend: one more step equal on both sides.
        tp2.resume_from_checkpoint(ref_dir, adapter_name="b")
        ref.resume_from_checkpoint(saved, adapter_name="b")
        assert tp2.optimizer_state_numel(adapter_name="b") == numels
        after = _train(tp2, steps=1)
        want = _train(ref, steps=1)
        assert after == pytest.approx(want, rel=1e-4)
        got = tp2.adapter_state_dict(adapter_name="b")
        for key, value in ref.adapter_state_dict(adapter_name="b").items():
            assert_rel_close(got[key], value)
