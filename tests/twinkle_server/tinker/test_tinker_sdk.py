"""The unmodified Tinker SDK against a live Twinkle server (real HTTP on loopback, tiny model)."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import numpy as np
import pytest
import tinker
from sdk_version import needs_in_process_server, sdk_version
from tinker import types

from twinkle.server.testing import KEYS

pytestmark = pytest.mark.integration

BASE_MODEL = "tiny/qwen3.5"
RNG = np.random.default_rng(0)
SEQ = RNG.integers(10, 4000, size=24).tolist()


def sft_datum(tokens: list[int], trained_from: int = 4) -> types.Datum:
    weights = [0.0] * (trained_from - 1) + [1.0] * (len(tokens) - trained_from)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


DATA = [sft_datum(SEQ), sft_datum(SEQ[:16])]


def train(client, steps: int, lr: float = 2e-2, data=DATA, before_step=None) -> list[float]:
    losses = []
    for _ in range(steps):
        if before_step is not None:
            before_step()
        fwd = client.forward_backward(data, "cross_entropy")
        opt = client.optim_step(types.AdamParams(learning_rate=lr))
        losses.append(fwd.result(timeout=60).metrics["loss:sum"])
        assert "grad_norm:mean" in opt.result(timeout=60).metrics
    return losses


def forward_loss(client, data=DATA) -> float:
    return client.forward(data, "cross_entropy").result(timeout=60).metrics["loss:sum"]


@pytest.fixture(scope="module")
def alice(service):
    return service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)


@pytest.fixture(scope="module")
def bob(service_bob):
    return service_bob.create_lora_training_client(base_model=BASE_MODEL, rank=8).result(timeout=60)


@needs_in_process_server
def test_two_tenants_with_different_ranks_train_at_once_and_are_fused(live_server, alice, bob):
    assert alice.get_info().lora_rank == 4 and bob.get_info().lora_rank == 8
    assert alice.get_info().model_data.tokenizer_id.count("/") >= 3
    model = live_server[1].services["model"]
    fused_before = model.scheduler.fused_passes
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        alice_losses, bob_losses = pool.map(lambda c: train(c, 5), [alice, bob])
        # Free-running clients can settle into alternating phases (one's forward_backward while
        # the other's optim_step runs); if no pass was fused, retry with both sending each
        # forward_backward at the same moment.
        barrier = threading.Barrier(2)
        for _ in range(3):
            if model.scheduler.fused_passes > fused_before:
                break
            list(pool.map(lambda c: train(c, 3, before_step=barrier.wait), [alice, bob]))
    assert alice_losses[-1] < alice_losses[0] * 0.9 and bob_losses[-1] < bob_losses[0] * 0.9
    assert model.scheduler.fused_passes > fused_before


def test_one_tenant_training_leaves_the_other_unchanged(alice, bob):
    before = forward_loss(bob)
    train(alice, 2)
    assert forward_loss(bob) == pytest.approx(before, rel=1e-6)


def test_cross_entropy_outputs_are_target_logprobs(alice):
    out = alice.forward(DATA, "cross_entropy").result(timeout=60)
    logprobs = [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]
    assert [len(lp) for lp in logprobs] == [len(SEQ) - 1, 15]
    weights = [d.loss_fn_inputs["weights"].to_numpy() for d in DATA]
    expected = -sum(float(np.dot(lp, w)) for lp, w in zip(logprobs, weights))
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)


def test_save_state_and_resume_with_optimizer_continue_exactly(service, alice):
    train(alice, 1)
    path = alice.save_state("resume-point").result(timeout=60).path
    assert path.startswith("tinker://") and path.endswith("/weights/resume-point")
    uninterrupted = train(alice, 2)
    resumed = service.create_training_client_from_state_with_optimizer(path).result(timeout=60)
    assert resumed.get_info().lora_rank == 4
    assert train(resumed, 2) == pytest.approx(uninterrupted, rel=1e-5)
    weights_only = service.create_training_client_from_state(path).result(timeout=60)
    assert forward_loss(weights_only) == pytest.approx(uninterrupted[0], rel=1e-5)


def test_sampling_from_saved_weights_with_logprobs(service, alice):
    prompt = types.ModelInput.from_ints(SEQ[:6])
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    named = alice.save_weights_for_sampler("for-sampling").result(timeout=60).path
    assert "/sampler_weights/for-sampling" in named
    sampler = service.create_sampling_client(model_path=named)
    result = sampler.sample(
        prompt, num_samples=2, sampling_params=params, include_prompt_logprobs=True
    ).result(timeout=60)
    assert len(result.sequences) == 2
    for seq in result.sequences:
        assert 1 <= len(seq.tokens) <= 4 and len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0 for lp in seq.logprobs)
        assert sdk_version() < (0, 27) or seq.sequence_id  # older SDKs have no sequence ids
    assert result.prompt_logprobs[0] is None and len(result.prompt_logprobs) == 6
    # The sampler's prompt logprobs are the trained model's target logprobs.
    train_lp = alice.forward([sft_datum(SEQ[:6], 1)], "cross_entropy").result(timeout=60)
    np.testing.assert_allclose(
        result.prompt_logprobs[1:], train_lp.loss_fn_outputs[0]["logprobs"].tolist(), atol=1e-3
    )
    ephemeral = alice.save_weights_and_get_sampling_client()
    again = ephemeral.sample(prompt, num_samples=1, sampling_params=params).result(timeout=60)
    assert again.sequences[0].tokens
    logprobs = ephemeral.compute_logprobs(prompt).result(timeout=60)
    assert logprobs[0] is None and logprobs[1:] == pytest.approx(
        result.prompt_logprobs[1:], abs=1e-4
    )


def test_training_checkpoint_and_twinkle_paths_work_for_sampling(service, alice):
    path = alice.save_state("for-sampling-too").result(timeout=60).path
    twinkle_path = "twinkle://" + path.split("://", 1)[1]
    sampler = service.create_sampling_client(model_path=twinkle_path)
    out = sampler.sample(
        types.ModelInput.from_ints(SEQ[:5]),
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=2),
    ).result(timeout=60)
    assert 1 <= len(out.sequences[0].tokens) <= 2


def test_importance_sampling_step(alice):
    tokens = SEQ[:12]
    old = alice.forward([sft_datum(tokens, 1)], "cross_entropy").result(timeout=60)
    q = old.loss_fn_outputs[0]["logprobs"].to_numpy() - 0.1
    advantages = np.where(np.arange(len(tokens) - 1) >= 5, 1.0, 0.0).astype(np.float32)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": q.astype(np.float32),
            "advantages": advantages,
        },
    )
    out = alice.forward_backward([datum], "importance_sampling").result(timeout=60)
    lp = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    expected = -float(np.sum(np.exp(lp - q) * advantages))
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)
    alice.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=60)
    ppo = alice.forward(
        [datum], "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    ).result(timeout=60)
    assert np.isfinite(ppo.metrics["loss:sum"])


def test_rest_client_lists_runs_and_checkpoints(service, alice, bob):
    rest = service.create_rest_client()
    runs = rest.list_training_runs().result(timeout=30).training_runs
    ids = {r.training_run_id for r in runs}
    assert alice.model_id in ids and bob.model_id not in ids
    ckpts = rest.list_checkpoints(alice.model_id).result(timeout=30).checkpoints
    assert {"weights/resume-point", "sampler_weights/for-sampling"} <= {
        c.checkpoint_id for c in ckpts
    }
    info = rest.get_weights_info_by_tinker_path(
        f"tinker://{alice.model_id}/weights/resume-point"
    ).result(timeout=30)
    assert info.base_model == BASE_MODEL and info.lora_rank == 4 and info.is_lora
    # Publishing is tested against a stand-in hub in test_tinker_publish.py.


@needs_in_process_server
def test_bad_inputs_fail_fast_and_change_nothing(service, alice, live_server):
    state = live_server[1].context.state
    runs_before = len(
        state.list_runs(live_server[1].context.authenticate({"x-api-key": KEYS["alice"]}))[0]
    )
    loss_before = forward_loss(alice)
    started = time.monotonic()
    bad_length = types.Datum(
        model_input=types.ModelInput.from_ints(SEQ[:8]),
        loss_fn_inputs={"target_tokens": SEQ[1:8], "weights": [1.0] * 8},
    )
    with pytest.raises(tinker.BadRequestError, match="target_tokens"):
        alice.forward_backward([bad_length], "cross_entropy").result(timeout=30)
    with pytest.raises(tinker.BadRequestError, match="vocabulary|token ids"):
        alice.forward_backward([sft_datum([5, 6, 7, 10**6])], "cross_entropy").result(timeout=30)
    with pytest.raises(tinker.BadRequestError, match="learning_rate"):
        alice.optim_step(types.AdamParams(learning_rate=-1.0)).result(timeout=30)
    with pytest.raises(tinker.NotFoundError, match="unknown base model"):
        service.create_lora_training_client(base_model="nope/model", rank=4).result(timeout=30)
    assert time.monotonic() - started < 20
    assert forward_loss(alice) == loss_before
    owner = live_server[1].context.authenticate({"x-api-key": KEYS["alice"]})
    assert len(state.list_runs(owner)[0]) == runs_before
    train(alice, 1)  # the client still works, nothing waits on the refused seq_ids


@needs_in_process_server
def test_resubmission_is_idempotent(live_server):
    from tinker.proto.request_conv import forward_backward_request_to_proto

    url, server = live_server
    model = server.services["model"]
    owner = server.context.authenticate({"x-api-key": KEYS["alice"]})
    with httpx.Client(base_url=url, headers={"X-API-Key": KEYS["alice"]}, timeout=30) as http:
        session = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
        create = {
            "session_id": session,
            "model_seq_id": 0,
            "base_model": BASE_MODEL,
            "lora_config": {"rank": 2},
        }
        model_id = _wait(http, http.post("/api/v1/create_model", json=create).json()["request_id"])[
            "model_id"
        ]
        request = types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(data=DATA, loss_fn="cross_entropy"),
            model_id=model_id,
            seq_id=1,
        )
        proto = forward_backward_request_to_proto(request).SerializeToString()
        headers = {"Content-Type": "application/x-protobuf"}
        fwd = [
            http.post("/api/v1/forward_backward", content=proto, headers=headers).json()
            for _ in range(2)
        ]
        body = {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": 1e-3}}
        first = http.post(
            "/api/v1/optim_step", json=body, headers={"X-Idempotency-Key": "k1"}
        ).json()
        second = http.post(
            "/api/v1/optim_step", json=body, headers={"X-Idempotency-Key": "k1"}
        ).json()
        third = http.post("/api/v1/optim_step", json=body).json()  # same (model_id, seq_id, body)
        assert fwd[0]["request_id"] == fwd[1]["request_id"]
        assert first["request_id"] == second["request_id"] == third["request_id"]
        assert "protobuf" in _wait(http, fwd[0]["request_id"])
        assert "metrics" in _wait(http, first["request_id"])
    assert model.model.tenants[model._internal(owner, model_id)].cur_step == 1


def _wait(http: httpx.Client, request_id: str, accept: str = "application/x-protobuf") -> dict:
    deadline = time.monotonic() + 30
    while True:
        reply = http.post(
            "/api/v1/retrieve_future", json={"request_id": request_id}, headers={"Accept": accept}
        )
        if reply.headers.get("content-type", "").startswith("application/x-protobuf"):
            return {"protobuf": reply.content}
        data = reply.json()
        if data.get("type") != "try_again" or time.monotonic() > deadline:
            return data


def test_futures_are_private_to_their_tenant(live_server):
    url = live_server[0]
    body = {
        "num_samples": 1,
        "base_model": BASE_MODEL,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": SEQ[:4]}]},
        "sampling_params": {"max_tokens": 2, "temperature": 1.0},
    }
    with httpx.Client(base_url=url, headers={"X-API-Key": KEYS["alice"]}, timeout=30) as http:
        submitted = http.post("/api/v1/asample", json=body).json()
        assert len(submitted["sample_sequence_ids"]) == 1
        assert "protobuf" in _wait(http, submitted["request_id"])
        # An SDK that does not ask for protobuf (before 0.27) reads the same result as JSON.
        as_json = _wait(http, submitted["request_id"], accept="application/json")
        assert as_json["type"] == "sample" and len(as_json["sequences"][0]["tokens"]) == 2
        foreign = http.post(
            "/api/v1/retrieve_future",
            json={"request_id": submitted["request_id"]},
            headers={"X-API-Key": KEYS["bob"]},
        )
        assert foreign.status_code == 404
