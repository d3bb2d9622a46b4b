"""The README's first command, served: the demo on Ray Serve trains both tenants and shuts down."""

import pytest


@pytest.mark.integration
def test_the_served_readme_demo_trains_both_tenants_and_shuts_down(tmp_path):
    import ray

    from twinkle.server import demo

    history = demo.run(steps=3, output_dir=tmp_path)
    assert {k: len(v) for k, v in history.items()} == {"tenant_a": 3, "tenant_b": 3}
    assert (tmp_path / "loss_curves.png").stat().st_size > 1000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for tenant in ("tenant_a", "tenant_b"):  # the training history, read back by TensorBoard
        board = EventAccumulator(str(tmp_path / "tensorboard" / tenant))
        board.Reload()
        assert [e.step for e in board.Scalars("loss")] == [1, 2, 3]
    assert not ray.is_initialized()
