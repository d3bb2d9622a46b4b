"""Vocab-parallel logits-free log-probs (tensor parallel 2, two gloo ranks) at Qwen3's real
vocabulary (151,936 rows): each rank its half of the head per chunk of tokens, the row figures
reduced over the group, equal to one process's whole-head computation and to the materialised
logits within 1e-5."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import socket  # noqa: E402

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from tests.twinkle.model.test_fused import assert_rel_close  # noqa: E402

VOCAB = 151_936
HIDDEN, RANK = 32, 4


def _inputs():
    """Hidden states, a head, one tenant's ``lm_head`` adapter on rows 1:3, targets (some -100,
    some in each rank's half)."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, HIDDEN, generator=g)
    weight = 0.2 * torch.randn(VOCAB, HIDDEN, generator=g)
    lora_A = 0.3 * torch.randn(RANK, HIDDEN, generator=g)
    lora_B = 0.3 * torch.randn(VOCAB, RANK, generator=g)
    targets = torch.randint(0, VOCAB, (3, 7), generator=g)
    targets[0, :2] = -100
    targets[2, 3] = VOCAB // 2  # the first row of the second half
    targets[1, 4] = VOCAB // 2 - 1  # the last of the first
    return hidden, weight, lora_A, lora_B, targets


def _compute(shard, trainable_head):
    """Log-probs, hits, entropies and the gradients of a loss over them; ``shard``: this
    process's half of the head (its gradient is this half's)."""
    from twinkle.model.step.linear_logprobs import LoraHeadRows, linear_token_logprobs

    hidden, weight, lora_A, lora_B, targets = _inputs()
    hidden.requires_grad_(True)
    lora_A.requires_grad_(True)
    lora_B.requires_grad_(True)
    if shard is not None:
        rows = VOCAB // 2
        weight = weight[shard.start : shard.start + rows].clone()
    weight.requires_grad_(trainable_head)
    u = hidden[1:3] @ lora_A.T * 0.5
    chunk_bytes = 4 * (VOCAB // 2) * 5  # chunks of 5 tokens per half (2 at the whole head)
    stats = linear_token_logprobs(
        hidden,
        weight,
        targets,
        chunk_bytes=chunk_bytes,
        entropies=True,
        lora=[LoraHeadRows(1, 3, u, lora_B)],
        shard=shard,
    )
    loss = -(stats.logprobs * torch.linspace(0.5, 1.5, 7)).sum()
    loss.backward()
    out = {
        "logprobs": stats.logprobs.detach(),
        "hits": stats.hits,
        "entropies": stats.entropies,
        "hidden": hidden.grad,
        "A": lora_A.grad,
        "B": lora_B.grad,
    }
    if trainable_head:
        out["weight"] = weight.grad
    return out


def _rank(rank, port, results):
    import torch.distributed as dist

    from twinkle.model.megatron import _build
    from twinkle.model.megatron._model import tp_vocab_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank)
    try:
        _build.init_megatron(torch.device("cpu"), 0, tp_size=2)
        shard = tp_vocab_shard(VOCAB)
        results[rank] = {trainable: _compute(shard, trainable) for trainable in (False, True)}
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_chunks_equal_the_whole_head():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    manager = mp.get_context("spawn").Manager()
    results = manager.dict()
    mp.spawn(_rank, args=(port, results), nprocs=2, join=True)
    for trainable in (False, True):
        whole = _compute(None, trainable)
        for rank in range(2):
            got = results[rank][trainable]
            torch.testing.assert_close(got["logprobs"], whole["logprobs"], rtol=1e-5, atol=1e-6)
            assert torch.equal(got["hits"], whole["hits"])
            torch.testing.assert_close(got["entropies"], whole["entropies"], rtol=1e-5, atol=1e-6)
            for name in ("hidden", "A", "B"):  # whole on every rank
                assert whole[name].norm() > 0
                assert_rel_close(got[name], whole[name])
            if trainable:  # each rank its half of the head's gradient
                half = whole["weight"].chunk(2)[rank]
                assert_rel_close(got["weight"], half)
    assert (whole["logprobs"][0, :2] == 0).all()


@pytest.mark.slow
def test_tp2_logits_free_equals_materialised(tmp_path):
    """The whole step at tp 2: losses, log-probs and each tenant's first Adam update equal the
    materialised logits' run. The update is ``lr * g / (|g| + eps)``: a relative change of ``g``
    moves it by at most as much, and lr 10 with eps 0.01 keeps it large next to the weights'
    rounding."""
    from tests.twinkle.model.megatron.test_megatron_real_vocab import TENANTS, _requests
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    runs = []
    for linear in (True, False):
        with ParallelMegatronModel(
            "tiny://qwen3-vocab", tp_size=2, options={"linear_logprobs": linear}
        ) as m:
            for name, (r, seed, targets, loss) in TENANTS.items():
                config = {"r": r, "lora_alpha": 2 * r, "target_modules": targets}
                m.add_adapter_to_model(name, {**config, "init_lora_weights": False}, seed=seed)
                m.set_optimizer("Adam", adapter_name=name, lr=10.0, eps=0.01)
                if loss is not None:
                    m.set_loss(loss[0], adapter_name=name, **loss[1])
            before = {n: m.adapter_state_dict(adapter_name=n) for n in TENANTS}
            out = m.forward_backward_many(_requests())
            m.clip_grad_and_step_many(list(TENANTS), max_grad_norm=1e9)
            after = {n: m.adapter_state_dict(adapter_name=n) for n in TENANTS}
            updates = {n: {k: after[n][k] - before[n][k] for k in before[n]} for n in TENANTS}
            runs.append((out, updates))
    (free, free_updates), (mat, mat_updates) = runs
    for name in TENANTS:
        assert free[name]["loss"] == pytest.approx(mat[name]["loss"], rel=1e-5)
        for a, b in zip(free[name]["logprobs"], mat[name]["logprobs"]):
            torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-5, atol=1e-5)
        assert any("lm_head" in k for k in mat_updates["dpo"])
        for key, update in mat_updates[name].items():
            assert update.norm() > 0, key
            assert_rel_close(free_updates[name][key], update)


def _tp_run(recompute, **layout):
    """Two tenants fused in one pass on a parallel model: losses and each first Adam update."""
    from tests.twinkle.model.megatron.test_megatron_real_vocab import TENANTS, _requests
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    options = {"activation_recompute": recompute}
    with ParallelMegatronModel("tiny://qwen3-vocab", options=options, **layout) as m:
        for name, (r, seed, targets, loss) in TENANTS.items():
            config = {"r": r, "lora_alpha": 2 * r, "target_modules": targets}
            m.add_adapter_to_model(name, {**config, "init_lora_weights": False}, seed=seed)
            m.set_optimizer("Adam", adapter_name=name, lr=10.0, eps=0.01)
            if loss is not None:
                m.set_loss(loss[0], adapter_name=name, **loss[1])
        before = {n: m.adapter_state_dict(adapter_name=n) for n in TENANTS}
        out = m.forward_backward_many(_requests())
        m.clip_grad_and_step_many(list(TENANTS), max_grad_norm=1e9)
        after = {n: m.adapter_state_dict(adapter_name=n) for n in TENANTS}
    return out, {n: {k: after[n][k] - before[n][k] for k in before[n]} for n in TENANTS}


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout", [{"tp_size": 2}, {"tp_size": 1, "pp_size": 2}], ids=["tp2", "pp2"]
)
def test_recompute_on_parallel_layouts_changes_nothing(layout):
    """megatron's recompute at tp 2 (each rank reruns its layers and their collectives) and on
    two pipeline stages (microbatches in flight): the same losses and updates as without it."""
    out_off, updates_off = _tp_run("off", **layout)
    out_on, updates_on = _tp_run("on", **layout)
    for name in out_off:
        assert out_on[name]["loss"] == pytest.approx(out_off[name]["loss"], rel=1e-6)
        for key, update in updates_off[name].items():
            assert update.norm() > 0, key
            assert_rel_close(updates_on[name][key], update, rel=1e-6)
