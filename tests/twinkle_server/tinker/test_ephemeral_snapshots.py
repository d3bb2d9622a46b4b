"""The unnamed sampler snapshot of save_weights_and_get_sampling_client is not a listed checkpoint."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from tinker import types

from twinkle.server.testing import KEYS

pytestmark = pytest.mark.integration

BASE_MODEL = "tiny/qwen3.5"


def test_snapshots_for_sampling_are_not_listed_and_their_prefix_is_reserved(service, live_server):
    client = service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)
    tokens = np.random.default_rng(3).integers(10, 4000, size=12).tolist()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    client.forward_backward([datum], "cross_entropy").result(timeout=60)
    sampler = client.save_weights_and_get_sampling_client()  # the DPO recipes' reference model
    prompt = types.ModelInput.from_ints(tokens[:4])
    params = types.SamplingParams(max_tokens=2, temperature=0.0)
    assert len(sampler.sample(prompt, 1, params).result(timeout=60).sequences) == 1
    named = client.save_weights_for_sampler("kept").result(timeout=60).path
    rest = service.create_rest_client()
    run_id = client.model_id
    listed = [c.checkpoint_id for c in rest.list_checkpoints(run_id).result(timeout=60).checkpoints]
    assert listed == ["sampler_weights/kept"], listed
    mine = rest.list_user_checkpoints().result(timeout=60).checkpoints
    assert not [c for c in mine if "ephemeral-" in c.checkpoint_id]
    assert named.endswith("/sampler_weights/kept")
    reply = httpx.post(
        f"{live_server[0]}/api/v1/save_weights_for_sampler",
        json={"model_id": run_id, "path": "ephemeral-mine", "seq_id": 99},
        headers={"X-API-Key": KEYS["alice"]},
        timeout=30,
    )
    assert reply.status_code == 400 and "reserved" in reply.text, reply.text
