"""The real Tinker SDK's core loop against servers on other backends than the single-process
transformers one: the mock backend, and transformers with ``device_mesh.dp_size: 2`` (the seed's
Transformers config). Both used to fail ``create_model``/``optim_step`` with a 5xx AttributeError
(the server reached into ``model._tenant``); now every backend implements ``optim_step``."""

from __future__ import annotations

import pytest
import tinker
from tinker import types

from twinkle.server.testing import KEYS, config_dict, serve_in_thread

pytestmark = pytest.mark.integration

BASE = "tiny/qwen3.5"
TOKENS = list(range(10, 40))


def _datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def _server(tmp_path, backend: str, **model_args):
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    config = config_dict(
        model_id="tiny://qwen3.5",
        backend=backend,
        sampler=True,
        server_args={"server_config": {"per_token_model_limit": 8, "supported_models": [BASE]}},
        **model_args,
    )
    config["applications"][2]["args"]["sampler_type"] = "mock" if backend == "mock" else "torch"
    config["storage"] = {"root": str(tmp_path / "storage")}
    return build_local_server(parse_config(config), store=MemoryStore(f"{backend}:"))


def _sft_loop(url: str) -> list[float]:
    from twinkle_client import init_tinker_client

    init_tinker_client()
    service = tinker.ServiceClient(base_url=url, api_key=KEYS["alice"])
    try:
        client = service.create_lora_training_client(base_model=BASE, rank=4, seed=7).result(
            timeout=120
        )
        data = [_datum(TOKENS), _datum(TOKENS[:12])]
        losses, steps = [], []
        for _ in range(4):
            fwd = client.forward_backward(data, "cross_entropy")
            opt = client.optim_step(types.AdamParams(learning_rate=2e-2, grad_clip_norm=10.0))
            losses.append(fwd.result(timeout=120).metrics["loss:sum"])
            metrics = opt.result(timeout=120).metrics
            assert metrics["grad_norm:mean"] > 0 and metrics["learning_rate:mean"] == 2e-2
            steps.append(metrics["step:max"])
        assert steps == [1.0, 2.0, 3.0, 4.0]
        assert losses[-1] < losses[0], losses
        # Bad Adam parameters are the caller's mistake, refused before anything changes.
        with pytest.raises(tinker.BadRequestError, match="beta1"):
            client.optim_step(types.AdamParams(learning_rate=1e-3, beta1=1.5)).result(timeout=60)

        path = client.save_state("backend-ckpt").result(timeout=120).path
        after_save = client.forward(data, "cross_entropy").result(timeout=120).metrics["loss:sum"]
        resumed = service.create_training_client_from_state(path).result(timeout=120)
        again = resumed.forward(data, "cross_entropy").result(timeout=120).metrics["loss:sum"]
        assert again == pytest.approx(after_save, rel=1e-5)

        sampler = client.save_weights_and_get_sampling_client()
        out = sampler.sample(
            types.ModelInput.from_ints(TOKENS[:6]),
            num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=3, temperature=1.0, seed=1),
        ).result(timeout=120)
        assert 1 <= len(out.sequences[0].tokens) <= 3
        return losses
    finally:
        service.close("success").result(timeout=30)


def test_tinker_sft_loop_on_the_mock_backend(tmp_path):
    server = _server(tmp_path, "mock")
    with serve_in_thread(server.app) as url:
        _sft_loop(url)


def test_tinker_sft_loop_on_two_data_parallel_replicas(tmp_path):
    import ray

    # Logical CPUs: each data-parallel rank reserves one, the 2-core host runs both.
    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        server = _server(
            tmp_path,
            "transformers",
            device_mesh={"device_type": "cpu", "dp_size": 2},
            device_group={"name": "model", "ranks": 2, "device_type": "cpu"},
        )
        with serve_in_thread(server.app) as url:
            data_parallel = _sft_loop(url)
    finally:
        ray.shutdown()
    # Two replicas train exactly as one process on the whole batch (Tinker's summed loss).
    single = _server(tmp_path / "single", "transformers")
    with serve_in_thread(single.app) as url:
        assert data_parallel == pytest.approx(_sft_loop(url), rel=1e-4)
