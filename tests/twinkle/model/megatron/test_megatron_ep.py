"""Expert parallel the megatron way: the ep ranks are the data-parallel ranks, each runs its share
of the rows, megatron's all-to-all moves the tokens to their experts and back, and the dense
adapters' gradients are all-reduced over the dp group. Equal to the transformers backend."""

import time

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from tests.twinkle.model.megatron._equivalence import (  # noqa: E402
    MARK,
    MarkedNanLoss,
    assert_equals_reference,
    assert_rel_close,
    make_batch,
    train_two_tenants,
)

MOE = "tiny://qwen3-moe"


def train(model, out_dir):
    """The two tenants' fused passes and clipped step, then tenant a alone with one row (fewer
    rows than ranks); the losses, adapters and checkpoint of both."""
    losses, states, saved = train_two_tenants(model, out_dir)
    one = model.forward_backward(make_batch(1, 9, 5), adapter_name="a")["loss"]
    assert model.clip_grad_and_step(max_grad_norm=0.5, adapter_name="a")
    return losses + [one], states, saved, model.adapter_state_dict(adapter_name="a")


@pytest.mark.slow
def test_ep2_rows_split_equals_the_transformers_backend(tmp_path):
    """ep=2, two tenants r4 / r8 (3 and 2 rows: split 2/1 and 1/1 over the expert ranks; the
    experts carry no LoRA here): losses, post-step adapters and the saved checkpoint equal the
    transformers backend, and each rank ran only its rows."""
    from twinkle.errors import InvalidArgumentError
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    ref_losses, ref_states, ref_saved, ref_a = train(MultiLoraTransformersModel(MOE), tmp_path)
    with ParallelMegatronModel(MOE, tp_size=1, ep_size=2, launcher="process") as ep2:
        assert (ep2.world, ep2.dp_size) == (2, 2)
        losses, states, saved, a = train(ep2, tmp_path / "ep2")
        # Two fused calls of a 2/1 + b 1/1 rows (whole: 5 rows per rank per call), then the
        # one-row call, which every rank runs whole (a rank without rows would miss the
        # all-to-alls): rank 0 2*3 + 1, rank 1 2*2 + 1 rows.
        rows = [r for r, _ in ep2.computed_rows()]
        assert rows == [7, 5]
        # A bad row in rank 1's share alone: both ranks refuse before any all-to-all; the real
        # error (not the peer's PeerFailedError) comes back, and the world still trains.
        bad = make_batch(2, 8, 6)
        bad["input_ids"][1, 2] = 10**6
        with pytest.raises(InvalidArgumentError, match="vocabulary range"):
            ep2.forward_backward(bad, adapter_name="b")
        assert [r for r, _ in ep2.computed_rows()] == rows  # nothing ran
        assert ep2.forward_backward(make_batch(2, 8, 7), adapter_name="b")["loss"] > 0
        # A loss that fails after the forward on rank 1's row alone: every rank stops before
        # its backward (whose all-to-alls would otherwise wait for rank 1 until the 600 s call
        # timeout); rank 1's own error comes back, and the world still trains.
        ep2.set_loss(MarkedNanLoss(), adapter_name="b")
        marked = make_batch(2, 8, 8)
        marked["input_ids"][1, 5] = marked["labels"][1, 5] = MARK
        started = time.monotonic()
        with pytest.raises(InvalidArgumentError, match="loss is not finite"):
            ep2.forward_backward(marked, adapter_name="b")
        assert time.monotonic() - started < 60
        assert ep2.forward_backward(make_batch(2, 8, 9), adapter_name="a")["loss"] > 0
    assert_equals_reference((ref_losses[:4], ref_states, ref_saved), losses[:4], states, saved)
    assert losses[4] == pytest.approx(ref_losses[4], rel=1e-4)
    for key, want in ref_a.items():
        assert_rel_close(a[key], want)


@pytest.mark.slow
def test_ep2_expert_lora_equals_the_transformers_backend(tmp_path):
    """LoRA on the experts under ep=2: tenants with both expert weights (3 rows: 2/1 over the
    ranks), none (4 rows: 2/2) and gate/up only (5 rows: 3/2); the experts' tokens come from both
    ranks, each weighted by its own rank's share of its tenant's loss. Losses and every
    post-step adapter tensor equal the transformers backend's (1e-4), then a one-row call (run
    whole on each rank, synchronised) too."""
    from tests.twinkle.model.megatron._equivalence import (
        assert_expert_run_equal,
        train_expert_tenants,
    )
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    expected = train_expert_tenants(MultiLoraTransformersModel(MOE), tmp_path / "ref", True)
    with ParallelMegatronModel(MOE, tp_size=1, ep_size=2, launcher="process") as ep2:
        run = train_expert_tenants(ep2, tmp_path / "ep2", True)
        rows = [r for r, _ in ep2.computed_rows()]
    assert rows == [2 * 7 + 1, 2 * 5 + 1]  # split rows twice, then the one row on each
    assert_expert_run_equal(expected, run)


def test_ep_with_another_dp_size_is_refused_naming_both():
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    with pytest.raises(ValueError, match="ep_size 2 with dp_size 4 is not built.*dp_size must"):
        ParallelMegatronModel(MOE, tp_size=1, ep_size=2, dp_size=4)


def train_dpo(model):
    """A DPO tenant (3 (chosen, rejected) pairs: split over 2 ranks as 2 pairs and 1), then a
    fused call with one pair for it (rank 0 alone has DPO rows and a reference pass to run) and
    two rows for an SFT tenant."""
    config = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "init_lora_weights": False}
    for name, seed in (("p", 3), ("s", 4)):
        model.add_adapter_to_model(name, config, seed=seed)
        model.set_optimizer("Adam", adapter_name=name, lr=1e-2, eps=1.0)
    model.set_loss("DPOLoss", adapter_name="p", beta=0.1)
    pairs = make_batch(6, 12, 8)
    losses = []
    for _ in range(2):
        losses.append(model.forward_backward(pairs, adapter_name="p")["loss"])
        assert model.clip_grad_and_step(max_grad_norm=0.5, adapter_name="p")
    mixed = {"p": {"inputs": make_batch(2, 10, 9)}, "s": {"inputs": make_batch(2, 10, 10)}}
    out = model.forward_backward_many(mixed)
    model.clip_grad_and_step_many(["p", "s"], max_grad_norm=0.5)
    losses += [out["p"]["loss"], out["s"]["loss"]]
    return losses, {n: model.adapter_state_dict(adapter_name=n) for n in ("p", "s")}


@pytest.mark.slow
def test_ep2_keeps_dpo_pairs_together_and_equals_the_transformers_backend():
    """DPO pairs stay on one rank; a rank whose rows need no reference pass runs one anyway when
    a peer does (else the peer's reference pass would wait in its all-to-alls forever); an odd
    DPO batch is refused by every rank alike."""
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    ref_losses, ref_states = train_dpo(MultiLoraTransformersModel(MOE))
    with ParallelMegatronModel(MOE, tp_size=1, ep_size=2, launcher="process") as ep2:
        losses, states = train_dpo(ep2)
        rows = [r for r, _ in ep2.computed_rows()]
        # 5 DPO rows: split 2/3, rank 1's loss alone would refuse its odd share after its
        # forward (rank 0 waiting in the backward); run whole, every rank refuses it alike.
        with pytest.raises(ValueError, match="odd batch of 5"):
            ep2.forward_backward(make_batch(5, 8, 11), adapter_name="p")
        assert ep2.forward_backward(make_batch(2, 8, 12), adapter_name="p")["loss"] > 0
    # Two DPO calls of 4 / 2 rows, each with its reference pass: 16 / 8; the mixed call: rank 0
    # p's pair + one s row, p's reference pass: 5; rank 1 one s row and its reference pass: 2.
    assert rows == [21, 10]
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    assert losses[1] != pytest.approx(losses[0], rel=1e-3)
    for name, ref_state in ref_states.items():
        for key, want in ref_state.items():
            assert_rel_close(states[name][key], want)
