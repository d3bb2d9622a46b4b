"""Served expert parallel: ``device_mesh: {dp_size: 2, ep_size: 2}`` on a Qwen3-MoE model builds
one world of two expert ranks (megatron carves the expert groups from the dp ranks), and two
tenants of different ranks train through the in-process server with the seed's Megatron flow,
each rank running its share of the rows."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from tests.twinkle.model.megatron._equivalence import served_seed_flow  # noqa: E402
from twinkle.server.testing import local_server  # noqa: E402


@pytest.mark.slow
def test_served_ep2_moe_model_trains_two_tenants(tmp_path):
    from twinkle.model.megatron.parallel import ParallelMegatronModel

    server = local_server(
        tmp_path,
        model_id="tiny://qwen3-moe",
        backend="megatron",
        device_group={"name": "model", "ranks": 2, "device_type": "cpu"},
        device_mesh={"device_type": "cpu", "dp_size": 2, "ep_size": 2},
    )
    model = server.services["model"].model
    try:
        assert isinstance(model, ParallelMegatronModel) and model.ep_size == 2
        losses = served_seed_flow(server, "/api/v1/model/tiny/qwen3-moe")
        # 3 steps x 2 tenants x 2 rows, split 1/1: 6 rows per rank (the whole batch: 12).
        assert [rows for rows, _ in model.computed_rows()] == [6, 6]
    finally:
        model.close()
    for name in losses:
        assert losses[name][-1] < losses[name][0], losses
