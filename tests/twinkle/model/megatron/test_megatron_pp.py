"""Pipeline parallel megatron (pp=2; tp=2 x pp=2) equals the transformers backend, fp32 on CPU."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch  # noqa: E402

from tests.twinkle.model.megatron._equivalence import (  # noqa: E402
    assert_equals_reference,
    make_batch,
    train_two_tenants,
)
from twinkle.errors import InvalidArgumentError  # noqa: E402
from twinkle.hub import load_config  # noqa: E402
from twinkle.model.megatron import _pp  # noqa: E402
from twinkle.model.megatron._pp_model import merge_optimizer_states  # noqa: E402
from twinkle.model.megatron.parallel import answer_rank  # noqa: E402


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The transformers backend's run of ``train_two_tenants`` (and the model, for resume)."""
    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel("tiny://qwen3")
    losses, states, saved = train_two_tenants(model, tmp_path_factory.mktemp("hf"))
    return losses, states, saved


@pytest.mark.slow
def test_pp2_equals_the_transformers_backend(reference, tmp_path):
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    with ParallelMegatronModel("tiny://qwen3", tp_size=1, pp_size=2) as pp2:
        losses, states, saved = train_two_tenants(pp2, tmp_path / "pp2")
        # Resume on the same pipeline from a checkpoint with optimizer state: the next pass's
        # loss equals the uninterrupted model's.
        ckpt = pp2.save("resume", output_dir=str(tmp_path), save_optimizer=True, adapter_name="a")
        batch = {"a": {"inputs": make_batch(3, 12, 1)}}
        pp2.clip_grad_and_step_many(["a"], max_grad_norm=0.5)
        want = pp2.forward_backward_many(batch)["a"]["loss"]
        pp2.zero_grad(adapter_name="a")
        pp2.remove_adapter("a")
        pp2.add_adapter_to_model("a", {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})
        pp2.resume_from_checkpoint(ckpt, adapter_name="a")
        pp2.clip_grad_and_step_many(["a"], max_grad_norm=0.5)
        got = pp2.forward_backward_many(batch)["a"]["loss"]
        # A pass only the last stage refuses (a non-finite loss: the earlier stage's loss is on
        # stand-in logits) fails at once on every stage, and leaves no stale message behind:
        # the next pass gives the loss of the same weights before it.
        probe = make_batch(2, 8, 5)
        before = pp2.forward_only(probe, adapter_name="b")["loss"]
        pp2.set_loss("GRPOLoss", adapter_name="b")
        nan = {"inputs": probe, "advantages": [float("nan")] * 2}
        with pytest.raises(InvalidArgumentError, match="not finite"):
            pp2.forward_backward_many({"a": {"inputs": make_batch(3, 12, 1)}, "b": nan})
        pp2.set_loss("CrossEntropyLoss", adapter_name="b")
        after = pp2.forward_backward_many({"b": {"inputs": probe}})["b"]["loss"]
    assert_equals_reference(reference, losses, states, saved)
    assert got == pytest.approx(want, rel=1e-5)
    assert after == pytest.approx(before, rel=1e-6)


@pytest.mark.slow
def test_tp2_pp2_equals_the_transformers_backend(reference, tmp_path):
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    with ParallelMegatronModel("tiny://qwen3", tp_size=2, pp_size=2, num_microbatches=3) as m:
        assert m.world == 4 and m.answer == 2
        losses, states, saved = train_two_tenants(m, tmp_path / "tp2pp2")
    assert_equals_reference(reference, losses, states, saved)


def test_stage_layers_split_evenly_and_check_pp_names_the_layers():
    assert _pp.stage_layers(8, 2, 0) == range(0, 4)
    assert _pp.stage_layers(8, 2, 1) == range(4, 8)
    assert _pp.stage_layers(8, 4, 3) == range(6, 8)
    config = load_config("tiny://qwen3")  # 2 layers
    _pp.check_pp(config, "tiny://qwen3", 2)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        _pp.check_pp(config, "tiny://qwen3", 3)
    with pytest.raises(ValueError, match="pp_size must be >= 1"):
        _pp.check_pp(config, "tiny://qwen3", 0)


def test_microbatches_cover_the_rows_in_order():
    cuts = _pp.microbatch_rows(5, 2)
    assert [(c.start, c.stop) for c in cuts] == [(0, 3), (3, 5)]
    assert [(c.start, c.stop) for c in _pp.microbatch_rows(2, 4)] == [(0, 1), (1, 2)]
    assert _pp.microbatch_rows(1, 1) == [slice(0, 1)]


def test_the_last_stage_answers():
    assert answer_rank(1, 2) == 1
    assert answer_rank(2, 2) == 2  # ranks 0, 1: stage 0; ranks 2, 3: stage 1
    assert answer_rank(2, 1) == 0
    assert answer_rank(2, 2, dp_size=2) == 4


def test_stage_optimizer_states_merge_in_the_one_process_order():
    def state(values, lr=0.1):
        return {
            "state": {
                i: {"step": torch.tensor(1.0), "exp_avg": torch.tensor(v)}
                for i, v in enumerate(values)
            },
            "param_groups": [{"lr": lr, "params": list(range(len(values)))}],
        }

    merged = merge_optimizer_states([state([1.0, 2.0]), state([3.0])])
    assert merged["param_groups"][0]["params"] == [0, 1, 2]
    assert [float(merged["state"][i]["exp_avg"]) for i in range(3)] == [1.0, 2.0, 3.0]
    from twinkle.model.megatron._pp_model import slice_optimizer_state

    back = slice_optimizer_state(merged, 2, 1)
    assert back["param_groups"][0]["params"] == [0]
    assert float(back["state"][0]["exp_avg"]) == 3.0


@pytest.mark.slow
def test_dp2_tp2_in_one_world_equals_the_transformers_backend(reference, tmp_path):
    """dp 2 x tp 2: four ranks, megatron's dp groups; each tenant's rows split over the two
    replicas (3 rows: 2/1, 2 rows: 1/1, the padded row alone), gradients scaled by each
    replica's normaliser share and all-reduced."""
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    with ParallelMegatronModel("tiny://qwen3", tp_size=2, dp_size=2) as m:
        assert m.world == 4 and m.replica_answers == [0, 2]
        losses, states, saved = train_two_tenants(m, tmp_path / "dp2tp2")
    assert_equals_reference(reference, losses, states, saved)


def test_a_served_megatron_dp_x_tp_mesh_builds_one_world(monkeypatch):
    """dp 2 x tp 2 (server_config_4b.yaml's mesh): the deployment asks the backend for one
    ParallelMegatronModel world (no Ray replicas); its rank actors reserve the group's GPUs, one
    each, and the replica none."""
    from tests.twinkle_server.config.config_samples import tiny_config_data
    from twinkle.server.config import parse_config
    from twinkle.server.model import backend as backend_module
    from twinkle.server.model import deployment
    from twinkle.server.process.placement import replica_num_gpus

    data = tiny_config_data()
    model_app = next(a for a in data["applications"] if a["import_path"] == "model")
    model_app["args"].update(
        backend="megatron",
        model_id="tiny://qwen3",
        device_group={"name": "model", "ranks": 4, "device_type": "cuda"},
        device_mesh={"device_type": "cuda", "dp_size": 2, "tp_size": 2},
    )
    config = parse_config(data)
    app = next(a for a in config.applications if a.import_path == "model")
    assert replica_num_gpus(app) == 0
    seen = {}

    def fake_backend(backend, model_id, **kwargs):
        seen.update(kwargs, backend=backend)
        raise RuntimeError("stop here")

    monkeypatch.setattr(deployment, "create_backend", fake_backend)
    with pytest.raises(RuntimeError, match="stop here"):
        deployment.build_service(app, None)
    assert (seen["dp_size"], seen["tp_size"], seen["pp_size"]) == (2, 2, 1)
    assert "worker_options" not in seen  # not Ray replicas
    assert seen["ray_options"]["num_gpus"] == 1.0  # 4 GPUs over the 4 rank actors
    built = {}

    class FakeParallel:
        def __init__(self, model_id, **kwargs):
            built.update(kwargs, model_id=model_id)

    import twinkle.model.megatron.parallel as parallel

    monkeypatch.setattr(parallel, "ParallelMegatronModel", FakeParallel)
    backend_module.create_backend("megatron", "tiny://qwen3", dp_size=2, tp_size=2)
    assert (built["dp_size"], built["tp_size"], built["pp_size"]) == (2, 2, 1)
