"""The megatron worker ranks as Ray actors (``launcher="ray"``): the same rank code as the
spawned processes, equal to the transformers backend at tp=2, and a killed actor failing the
next call at once with the rest closed."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from tests.twinkle.model.megatron._equivalence import (  # noqa: E402
    assert_equals_reference,
    make_batch,
    train_two_tenants,
)
from twinkle.model.megatron import _ranks  # noqa: E402


class _Model:
    def save(self, *args, **kwargs):
        return "written"

    def list_adapters(self):
        return ["a"]

    def boom(self):
        raise ValueError("bad field")

    def routes(self):
        return None


def test_one_rank_body_for_both_launchers():
    """``run_call`` is what a process and an actor run per call: writes on the answering rank
    only, results sent back from the answer ranks only, errors returned, not raised."""
    answer = _ranks.Rank(rank=0, model=_Model(), answer=0, answers=[0])
    other = _ranks.Rank(rank=1, model=_Model(), answer=0, answers=[0])
    assert _ranks.run_call(answer, "save", ("x",), {}) == (True, "written")
    assert _ranks.run_call(other, "save", ("x",), {}) == (True, None)  # written once
    assert _ranks.run_call(answer, "list_adapters", (), {}) == (True, ["a"])
    assert _ranks.run_call(other, "list_adapters", (), {}) == (True, None)
    ok, error = _ranks.run_call(other, "boom", (), {})
    assert not ok and isinstance(error, ValueError) and str(error) == "bad field"
    ok, error = _ranks.run_call(answer, "routes", (), {})
    assert not ok and "not remotable" in str(error)


def test_closing_ranks_whose_start_failed_part_way():
    """Regression: a start that failed after its first process (the second never started) made
    close() raise ``AssertionError: can only join a started process`` over the real error."""
    import multiprocessing as mp

    fork = mp.get_context("fork")
    started, never = fork.Process(target=int), fork.Process(target=int)
    started.start()
    ranks = _ranks.ProcessRanks(2)
    ranks.procs, ranks._inboxes = [started, never], [fork.Queue(), fork.Queue()]
    ranks.close()
    assert ranks.closed and started.exitcode == 0 and never.pid is None


def test_the_launcher_is_ray_exactly_when_ray_is_initialised():
    import ray

    from twinkle.model.megatron._ray_ranks import RayRanks

    assert _ranks.choose_launcher("ray") == "ray"
    assert _ranks.choose_launcher("process") == "process"
    with pytest.raises(ValueError, match="launcher must be one of"):
        _ranks.choose_launcher("mpi")
    if ray.is_initialized():
        pytest.skip("another test's Ray is running in this process")
    assert _ranks.choose_launcher(None) == "process"
    with pytest.raises(RuntimeError, match="needs Ray"):
        RayRanks(2)


def test_the_served_mesh_gives_each_rank_actor_its_gpu_and_node():
    from tests.twinkle_server.config.config_samples import tiny_config_data
    from twinkle.server.config import parse_config
    from twinkle.server.process.placement import megatron_rank_options

    def options(group, mesh, **args):
        data = tiny_config_data()
        app = next(a for a in data["applications"] if a["import_path"] == "model")
        app["args"].update(
            backend="megatron", model_id="tiny://qwen3", device_group=group, device_mesh=mesh
        )
        app["args"].update(args)
        config = parse_config(data)
        return megatron_rank_options(
            next(a for a in config.applications if a.import_path == "model")
        )

    gpu = options(
        {"name": "model", "ranks": 4, "device_type": "cuda"},
        {"device_type": "cuda", "tp_size": 2, "pp_size": 2},
        nproc_per_node=2,
    )
    assert gpu["num_gpus"] == 1.0 and gpu["nproc_per_node"] == 2
    cpu = options(
        {"name": "model", "ranks": 2, "device_type": "cpu"}, {"device_type": "cpu", "tp_size": 2}
    )
    assert cpu["num_gpus"] == 0 and "nproc_per_node" not in cpu  # one PACK group


@pytest.mark.slow
def test_ray_tp2_equals_the_transformers_backend(tmp_path, local_ray):
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    reference = train_two_tenants(MultiLoraTransformersModel("tiny://qwen3"), tmp_path / "hf")
    with ParallelMegatronModel("tiny://qwen3", tp_size=2) as tp2:  # Ray is up: actors
        assert tp2.launcher == "ray"
        where = tp2.placements()
        assert [p["rank"] for p in where] == [0, 1] and where[0]["pid"] != where[1]["pid"]
        losses, states, saved = train_two_tenants(tp2, tmp_path / "tp2")
    assert_equals_reference(reference, losses, states, saved)


@pytest.mark.slow
def test_a_killed_rank_actor_fails_the_next_call_and_closes_the_rest(local_ray):
    import time

    from ray.exceptions import RayActorError

    from twinkle.model.megatron.parallel import ParallelMegatronModel

    ray = local_ray
    model = ParallelMegatronModel("tiny://qwen3", tp_size=2, launcher="ray")
    try:
        model.add_adapter_to_model("a", {"r": 4, "target_modules": "all-linear"})
        survivor, group = model._ranks.actors[0], model._ranks._group
        ray.kill(model._ranks.actors[1])
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"ranks \{1: 'ActorDiedError'\} died"):
            model.forward_backward(make_batch(2, 8, 0), adapter_name="a")
        assert time.monotonic() - start < 30
        assert model.closed
        with pytest.raises(RayActorError):  # the survivor was killed too
            ray.get(survivor.where.remote(), timeout=60)
        state = ray.util.placement_group_table(group)["state"]
        assert state == "REMOVED"
        with pytest.raises(RuntimeError, match="closed"):
            model.list_adapters()
    finally:
        model.close()


@pytest.mark.slow
def test_a_placement_the_cluster_cannot_hold_fails_naming_it(local_ray):
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    ray = local_ray
    options = {"num_cpus": 4, "timeout_s": 2}  # the local Ray has 2 CPUs
    with pytest.raises(TimeoutError, match=r"cannot place 2 megatron ranks of \{'CPU': 4.0\}"):
        ParallelMegatronModel("tiny://qwen3", tp_size=2, launcher="ray", ray_options=options)
    groups = ray.util.placement_group_table().values()
    assert groups and all(g["state"] == "REMOVED" for g in groups)  # nothing left reserved
