"""Megatron rank actors over two Ray nodes: dp 2 x tp 2 with ``nproc_per_node: 2`` on two local
nodes of 2 logical GPUs each. Each node hosts one dp replica's two tp ranks, each rank holds one
GPU (its own ``CUDA_VISIBLE_DEVICES``; the compute falls back to the CPU and gloo here), and the
run equals the transformers backend."""

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from tests.twinkle.model.megatron._equivalence import assert_equals_reference, train_two_tenants  # noqa: E402


@pytest.fixture
def two_nodes():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        pytest.skip("another test's Ray is running in this process")
    node = {"num_cpus": 1, "num_gpus": 2, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    try:
        cluster.add_node(num_cpus=1, num_gpus=2)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_dp2_x_tp2_rank_actors_over_two_nodes_equal_the_transformers_backend(tmp_path, two_nodes):
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    options = {"num_gpus": 1, "nproc_per_node": 2}
    with ParallelMegatronModel("tiny://qwen3", tp_size=2, dp_size=2, ray_options=options) as m:
        where = m.placements()
        nodes = [p["node_id"] for p in where]
        # megatron's order tp-cp-ep-dp-pp: ranks 0, 1 (replica 0) on one node, 2, 3 on the other
        assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2], where
        assert all(p["resources"].get("GPU") == 1.0 for p in where), where
        gpus = {(p["node_id"], p["cuda_visible_devices"]) for p in where}
        assert len(gpus) == 4, where  # every rank its own GPU
        losses, states, saved = train_two_tenants(m, tmp_path / "dp2tp2")
    reference = train_two_tenants(MultiLoraTransformersModel("tiny://qwen3"), tmp_path / "hf")
    assert_equals_reference(reference, losses, states, saved)
