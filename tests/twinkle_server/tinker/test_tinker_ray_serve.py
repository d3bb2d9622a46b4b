"""The Tinker SDK against the tiny cookbook server deployed on real Ray Serve."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from twinkle.server.testing import KEYS, free_port

pytestmark = pytest.mark.integration

TINY_CONFIG = Path(__file__).resolve().parents[3] / "cookbook/client/server/tiny/server_config.yaml"


@pytest.fixture(scope="module")
def serve_url(tmp_path_factory):
    import ray
    from ray import serve

    from twinkle.server.config import parse_config
    from twinkle.server.process.launch import deploy

    data = yaml.safe_load(TINY_CONFIG.read_text())
    data["http_options"] = {"host": "127.0.0.1", "port": free_port()}
    data["storage"] = {"root": str(tmp_path_factory.mktemp("tinker-serve"))}
    data["auth"] = {"api_keys": list(KEYS.values())}
    data["applications"] = [a for a in data["applications"] if a["import_path"] != "processor"]
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        namespace=f"twinkle-tinker-{os.getpid()}",
    )
    try:
        yield deploy(parse_config(data), ready_timeout_s=120).rsplit("/api/v1", 1)[0]
    finally:
        serve.shutdown()
        ray.shutdown()


def test_sdk_trains_and_samples_through_ray_serve(serve_url):
    from twinkle_client import init_tinker_client

    init_tinker_client()
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=serve_url, api_key=KEYS["bob"])
    try:
        trainer = service.create_lora_training_client(base_model="tiny/qwen3.5", rank=4).result(
            timeout=60
        )
        tokens = list(range(100, 120))
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 19},
        )
        losses = []
        for _ in range(3):
            fwd = trainer.forward_backward([datum], "cross_entropy")
            trainer.optim_step(types.AdamParams(learning_rate=2e-2)).result(timeout=60)
            losses.append(fwd.result(timeout=60).metrics["loss:sum"])
        assert losses[-1] < losses[0]
        sampler = trainer.save_weights_and_get_sampling_client().result(timeout=60)
        out = sampler.sample(
            types.ModelInput.from_ints(tokens[:5]),
            num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=3),
        ).result(timeout=60)
        assert 1 <= len(out.sequences[0].tokens) <= 3 and len(out.sequences[0].logprobs) == len(
            out.sequences[0].tokens
        )
    finally:
        service.close("success").result(timeout=30)
