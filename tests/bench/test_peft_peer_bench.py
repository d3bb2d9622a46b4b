"""The training benchmark's peer and memory columns: bench/_peft_peer.py, bench/_mode_rss.py.

The peft mode must be the same work as the fused one (same adapters, same starting weights,
same loss and optimizer), or ``fused_vs_peft`` compares different things; each mode's memory
must be its own process's, not the benchmark's.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH_DIR))  # it imports its private modules as siblings
    try:
        spec = importlib.util.spec_from_file_location(
            "multi_tenant_train", BENCH_DIR / "multi_tenant_train.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH_DIR))
    return module


def test_peft_first_step_losses_equal_fused_in_fp32(bench):
    # Two tenants of different ranks, random B (so each adapter moves its loss); check_peft also
    # asserts that both loops start from bit-identical adapter weights.
    rounds = bench.check_peft("tiny://qwen3.5", ranks=(8, 32), rounds=2)
    first = rounds[0]
    assert sorted(first) == ["t0", "t1"]
    for fused, peft in first.values():
        assert abs(fused - peft) <= 1e-5 * abs(fused)
    assert abs(first["t0"][0] - first["t1"][0]) > 1e-3  # the two tenants' losses differ
    # After one clip + AdamW step each: still equal, and the step changed the losses.
    for name, (fused, peft) in rounds[1].items():
        assert abs(fused - peft) <= 1e-5 * abs(fused)
        assert fused != first[name][0]


def test_peft_gc_losses_equal_fused_and_its_layers_are_recomputed(bench):
    # Gradient checkpointing changes no value: the checkpointed peer's losses equal fused too.
    rounds = bench.check_peft(
        "tiny://qwen3.5", ranks=(8, 32), rounds=2, gradient_checkpointing=True
    )
    for fused, peft in rounds[0].values():
        assert abs(fused - peft) <= 1e-5 * abs(fused)
    for name, (fused, peft) in rounds[1].items():
        assert abs(fused - peft) <= 1e-5 * abs(fused) and fused != rounds[0][name][0]
    # ... and it does recompute: a decoder layer's MLP runs again in backward (twice a step),
    # where the plain peer runs it once.
    runs = {}
    for mode in bench.PEERS:
        peer = bench.build_peer(
            bench.resolve_model_dir("tiny://qwen3.5"),
            ["t0"],
            (8,),
            gradient_checkpointing=mode == "peft_gc",
        )
        mlp = peer.model.get_base_model().model.layers[0].mlp
        calls, forward = [], mlp.forward
        mlp.forward = lambda x, forward=forward, calls=calls: calls.append(1) or forward(x)
        peer.step({"t0": bench.make_batch(1, 16, seed=0)})
        runs[mode] = len(calls)
    assert runs == {"peft": 1, "peft_gc": 2}


def test_the_peer_regenerates_twinkles_initial_weights_per_seed(bench):
    from _peft_peer import twinkle_initial_state
    from transformers import AutoModelForCausalLM

    from twinkle.model.lora import adapter_state_dict

    model = bench.MultiLoraTransformersModel("tiny://qwen3.5")
    bench.add_tenant(model, "t0", 8, random_b=True)
    base = AutoModelForCausalLM.from_pretrained(model.model_dir, dtype=torch.float32)
    config = bench.lora_config(8, random_b=True)
    ours = adapter_state_dict(model.model, "t0")
    same = twinkle_initial_state(base, "t0", config, seed=model.seed)
    other = twinkle_initial_state(base, "t0", config, seed=model.seed + 1)
    assert set(same) == set(ours) and len(ours) > 0
    assert all(torch.equal(same[k], ours[k]) for k in ours)
    assert not all(torch.equal(other[k], ours[k]) for k in ours)  # the seed matters
    # The plain base model is left as it was: no wrapper stayed in it.
    assert not any("lora" in name for name, _ in base.named_modules())


def test_peft_step_trains_only_the_active_tenant(bench):
    peer = bench.build_peer(
        bench.resolve_model_dir("tiny://qwen3.5"), ["t0", "t1"], (8, 16), random_b=True
    )
    before = {n: {k: v.clone() for k, v in peer.state(n).items()} for n in ("t0", "t1")}
    peer.step({"t1": bench.make_batch(1, 16, seed=0)})
    after = {n: peer.state(n) for n in ("t0", "t1")}
    assert all(torch.equal(before["t0"][k], after["t0"][k]) for k in before["t0"])
    assert not all(torch.equal(before["t1"][k], after["t1"][k]) for k in before["t1"])


def test_many_tenant_points_only_when_asked(bench):
    assert len(bench.points(quick=False)) == 20  # the standard set is unchanged
    many = bench.points(quick=False, many=True)
    extra = [p for p in many if p.tenants in bench.MANY_TENANTS]
    assert [(p.model, p.tenants, p.batch) for p in extra] == [
        (m, n, 1) for m in bench.MODELS for n in (32, 64, 128)
    ]
    assert extra[0].ranks[:4] == (8, 16, 32, 8)  # mixed ranks, cycling
    # Naming their N selects them without the flag; the filters still apply.
    n64 = bench.points(quick=False, models=["tiny://qwen3.5"], tenants=[64])
    assert [(p.tenants, p.batch) for p in n64] == [(64, 1)]
    assert bench.points(quick=False, tenants=[64], batches=[4]) == []


def test_a_modes_peak_memory_is_its_own_process(bench):
    """One mode's memory run in a fresh process; the parent's resident memory (a 600 MB block
    touched here) must not show in the child's peak, as it would in getrusage's ru_maxrss."""
    import _mode_rss

    block = torch.ones(600 * 2**20 // 4)  # noqa: F841  (kept alive and resident)
    parent_rss = _mode_rss.rss_mb("VmRSS")
    point = bench.Point("tiny://qwen3.5", (8, 16), batch=1, seq=16)
    out = _mode_rss.measure(point, ("peft",), steps=1, threads=1)
    peak, floor = out["peak_rss_mb"]["peft"], out["import_rss_mb"]
    assert 0 < floor < peak  # building and stepping the model costs memory above the imports
    assert peak < parent_rss - 400  # none of the parent's 600 MB block
    assert "cuda_peak_mb" not in out or torch.cuda.is_available()


def test_a_failing_memory_run_names_the_mode_and_the_cause(bench):
    import _mode_rss

    assert _mode_rss.MODES == bench.MODES
    point = bench.Point("tiny://qwen3.5", (8,), batch=1, seq=16)
    with pytest.raises(RuntimeError, match="memory run of mode 'nope' failed") as info:
        _mode_rss.measure(point, ("nope",), steps=1, threads=1)
    assert "mode must be one of fused, sliced, limit, peft, peft_gc" in str(info.value)


def test_every_mode_builds_only_what_it_needs_and_steps(bench):
    # What each memory process builds (bench.mode_step), run here in-process: one step each.
    point = bench.Point("tiny://qwen3.5", (8, 16), batch=1, seq=16)
    for mode in bench.MODES:
        holder, step = bench.mode_step(point, mode)
        step()
        held = sorted(holder.optimizers if mode in bench.PEERS else holder.tenants)
        assert held == (["limit"] if mode == "limit" else ["t0", "t1"]), mode
        if mode in bench.PEERS:
            assert type(holder).__name__ == "PeftPeer"
            assert holder.gradient_checkpointing == (mode == "peft_gc")
            assert holder.model.training == (mode == "peft_gc")  # transformers: train() only
