"""Tensor parallel megatron (tp=2, two gloo ranks) equals the transformers backend, fp32 on CPU."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch  # noqa: E402

from tests.twinkle.model.megatron._equivalence import (  # noqa: E402
    assert_equals_reference,
    make_batch,
    served_seed_flow,
    train_two_tenants,
)
from twinkle.hub import load_config  # noqa: E402
from twinkle.model.megatron import _build  # noqa: E402


@pytest.mark.slow
def test_tp2_equals_the_transformers_backend(tmp_path):
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    reference = train_two_tenants(MultiLoraTransformersModel("tiny://qwen3"), tmp_path / "hf")
    with ParallelMegatronModel("tiny://qwen3", tp_size=2) as tp2:
        losses, states, saved = train_two_tenants(tp2, tmp_path / "tp2")
    # One standard PEFT checkpoint, written by rank 0: the transformers backend's keys and config.
    assert_equals_reference(reference, losses, states, saved)


def test_tp_size_must_divide_the_model_shapes():
    config = load_config("tiny://qwen3")  # 4 heads, 2 query groups
    _build.check_tp(config, "tiny://qwen3", 2)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        _build.check_tp(config, "tiny://qwen3", 4)
    with pytest.raises(ValueError, match="tp_size must be >= 1"):
        _build.check_tp(config, "tiny://qwen3", 0)


def test_load_shards_hf_weights_the_way_megatron_splits_them():
    # The tp shards, put back together, are the tp=1 layout: column splits output rows (fc1 per
    # half), row splits input columns.
    w = torch.arange(24.0).reshape(4, 6)
    halves = [_build.tp_shard(w, 1, 2, r) for r in range(2)]
    assert torch.equal(torch.cat(halves, 1), w)
    assert _build._split_dim("decoder.layers.0.self_attention.linear_qkv.weight") == 0
    assert _build._split_dim("decoder.layers.0.mlp.linear_fc2.weight") == 1
    assert _build._split_dim("decoder.layers.0.input_layernorm.weight") is None
    with pytest.raises(ValueError, match="does not divide"):
        _build.tp_shard(torch.zeros(3, 2), 0, 2, 0)


@pytest.mark.slow
def test_served_tp2_model_trains_two_tenants(tmp_path, local_ray):
    """``device_mesh.tp_size: 2`` through the in-process server: the seed's Megatron client flow
    (optimizer and scheduler 'default', no set_loss) for two tenants of different ranks. Ray is
    initialised, as in a Serve replica, so the ranks are Ray actors."""

    from twinkle.model.megatron.parallel import ParallelMegatronModel
    from twinkle.server.testing import local_server

    server = local_server(
        tmp_path,
        backend="megatron",
        device_group={"name": "model", "ranks": 2, "device_type": "cpu"},
        device_mesh={"device_type": "cpu", "tp_size": 2},
    )
    try:
        losses = served_seed_flow(server, "/api/v1/model/tiny/qwen3")
        model = server.services["model"].model
        assert isinstance(model, ParallelMegatronModel) and model.tp_size == 2
        assert model.launcher == "ray"
        where = model.placements()  # two actors, each in its bundle of the PACK group
        assert [p["rank"] for p in where] == [0, 1] and where[0]["pid"] != where[1]["pid"]
        assert all(p["resources"].get("CPU") == 0.25 for p in where), where
    finally:
        server.services["model"].model.close()
    for name in losses:
        assert losses[name][-1] < losses[name][0]


@pytest.mark.slow
def test_a_dead_rank_fails_the_next_call_at_once():
    """A rank killed mid-life: the next call raises naming it instead of hanging on the
    survivor (blocked in a collective), and the workers are closed."""
    import os
    import signal
    import time

    from twinkle.model.megatron.parallel import ParallelMegatronModel

    model = ParallelMegatronModel("tiny://qwen3", tp_size=2, launcher="process")
    try:
        model.add_adapter_to_model("a", {"r": 4, "target_modules": "all-linear"})
        os.kill(model._ranks.procs[1].pid, signal.SIGKILL)
        model._ranks.procs[1].join(timeout=30)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"ranks \{1: -9\} exited"):
            model.forward_backward(make_batch(2, 8, 0), adapter_name="a")
        assert time.monotonic() - start < 30
        assert model.closed and not model._ranks.procs
        with pytest.raises(RuntimeError, match="closed"):
            model.list_adapters()
    finally:
        model.close()


@pytest.mark.parametrize("launcher", ["process", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_rank_failing_alone_fails_its_call_in_seconds(monkeypatch, request, launcher):
    """One tp rank's loss raises (as an out-of-memory on one device would) while its peer goes
    on into the backward's all-reduce and waits there for it: the call fails with that rank's
    error once ``PEER_GRACE_S`` has passed, not after the 600 s call timeout, and the workers
    are closed (the peer would wait forever)."""
    import time

    from tests.twinkle.model.megatron._equivalence import FailsOnRankLoss
    from twinkle.model.megatron import _ranks
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    if launcher == "ray":
        # A Ray another module started is reused (the fixture leaves it running then).
        request.getfixturevalue("local_ray")
    monkeypatch.setattr(_ranks, "PEER_GRACE_S", 2.0)
    model = ParallelMegatronModel("tiny://qwen3", tp_size=2, launcher=launcher)
    try:
        model.add_adapter_to_model("a", {"r": 4, "target_modules": "all-linear"})
        model.forward_backward(make_batch(2, 8, 0), adapter_name="a")  # warm: both ranks work
        model.set_loss(FailsOnRankLoss(rank=1), adapter_name="a")
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"rank 1 failed \(MemoryError.*ranks \[0\]"):
            model.forward_backward(make_batch(2, 8, 1), adapter_name="a")
        # The failure, the grace (2 s, or twice the call's time to the error) and closing the
        # stuck peer (10 s join, then kill), with room for a loaded machine: far under 600 s.
        assert time.monotonic() - start < 90
        assert model.closed
    finally:
        model.close()
