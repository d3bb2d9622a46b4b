"""A sample whose gateway process died is resubmitted by the unmodified SDK by itself.

A sample changes no server state, so the gateway answers ``retrieve_future`` of an orphaned
sample future with 410: the SDK's sampling client maps that to its ``RetryableException`` and its
``RetryHandler`` sends the request again. Training futures keep their failed-future answer (a step
that may have run must not be run twice; its owner reloads from a checkpoint).
"""

from __future__ import annotations

import pytest
from tinker import types

from twinkle.server.testing import KEYS
from twinkle.server.tinker.futures import TinkerFutures

pytestmark = pytest.mark.integration

BASE_MODEL = "tiny/qwen3.5"
DEAD = "gw-dead-sampler"


def test_an_orphaned_sample_is_resubmitted_by_the_sdk_and_answers(
    service, live_server, monkeypatch
):
    server = live_server[1]
    if server is None:
        pytest.skip("needs the in-process server (its futures are patched)")
    state = server.context.state
    # A gateway process that ran a sample and was SIGKILLed: its lease has expired.
    state.store.put(
        f"instance/{DEAD}", {"host": "elsewhere", "pid": 1, "start": "1", "renewed_at": 0.0}
    )
    submitted: list[str] = []
    real_submit = TinkerFutures.submit

    def submit(self, owner, kind, runner, **kwargs):
        if kind != "sample" or submitted:
            rid = real_submit(self, owner, kind, runner, **kwargs)
            if kind == "sample":
                submitted.append(rid)
            return rid
        # The first sample: filed as running in the dead process, never run.
        record = state.create_future(owner, kind, model_id=kwargs.get("model_id"), instance=DEAD)
        for key in kwargs.get("dedupe") or []:
            state.remember_submission(owner, key, record.request_id)
        submitted.append(record.request_id)
        return record.request_id

    monkeypatch.setattr(TinkerFutures, "submit", submit)
    sampler = service.create_sampling_client(base_model=BASE_MODEL).result(timeout=60)
    prompt = types.ModelInput.from_ints([11, 200, 3000, 45])
    params = types.SamplingParams(max_tokens=3, temperature=0.0, seed=1)
    result = sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result(
        timeout=120
    )
    assert len(result.sequences) == 1 and len(result.sequences[0].tokens) == 3
    # Two submissions: the orphaned one, then the SDK's own resubmission that ran.
    assert len(submitted) == 2 and submitted[0] != submitted[1]
    owner = server.context.authenticate({"x-api-key": KEYS["alice"]})
    orphan = state.get_future(owner, submitted[0])
    assert orphan.status == "error" and "stopped (restarted or killed)" in orphan.error.message
    assert state.get_future(owner, submitted[1]).status == "done"


def test_an_orphaned_training_future_stays_a_failed_future_not_a_410(live_server):
    import httpx

    url, server = live_server
    if server is None:
        pytest.skip("needs the in-process server (its state is written directly)")
    state = server.context.state
    state.store.put(
        f"instance/{DEAD}", {"host": "elsewhere", "pid": 1, "start": "1", "renewed_at": 0.0}
    )
    owner = server.context.authenticate({"x-api-key": KEYS["alice"]})
    record = state.create_future(owner, "forward_backward", model_id="m", instance=DEAD)
    answer = httpx.post(
        f"{url}/api/v1/retrieve_future",
        json={"request_id": record.request_id},
        headers={"X-API-Key": KEYS["alice"]},
        timeout=30,
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["category"] == "server" and "resubmit" in body["error"]
