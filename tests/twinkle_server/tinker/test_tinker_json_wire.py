"""The JSON wire of SDKs before 0.27 (0.16.1, which ModelScope Twinkle pins), sent by hand:
``/forward`` and ``/forward_backward`` as JSON, results read back as JSON when the client does not
ask for protobuf; the same numbers the protobuf path gives the current SDK."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from tinker import types

from twinkle.server.testing import KEYS

pytestmark = pytest.mark.integration

BASE_MODEL = "tiny/qwen3.5"
TOKENS = list(range(30, 50))
WEIGHTS = [0.0] * 4 + [1.0] * 15


def _datum_json() -> dict:
    """A ``Datum`` as 0.16.1 serialises it (``model_dump(mode='json')``)."""
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": TOKENS[:-1]}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": TOKENS[1:], "dtype": "int64", "shape": [19]},
            "weights": {"data": WEIGHTS, "dtype": "float32", "shape": [19]},
        },
    }


@pytest.fixture(scope="module")
def dave(service):
    return service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)


@pytest.fixture(scope="module")
def http(live_server):
    headers = {"X-API-Key": KEYS["alice"], "Authorization": f"Bearer {KEYS['alice']}"}
    with httpx.Client(base_url=live_server[0] + "/api/v1", headers=headers, timeout=60) as client:
        yield client


def _result(http: httpx.Client, request_id: str) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = http.post("/retrieve_future", json={"request_id": request_id})
        assert reply.status_code == 200, reply.text
        assert "json" in reply.headers["content-type"]
        body = reply.json()
        if body.get("type") != "try_again":
            return body
    raise TimeoutError(request_id)


def test_a_json_forward_reads_back_as_json_with_the_protobuf_numbers(dave, http):
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": WEIGHTS},
    )
    expected = dave.forward([datum], "cross_entropy").result(timeout=60)
    reply = http.post(
        "/forward",
        json={
            "forward_input": {"data": [_datum_json()], "loss_fn": "cross_entropy"},
            "model_id": dave.model_id,
            "seq_id": 1,  # at or below the last: queued after the SDK's calls
        },
    )
    assert reply.status_code == 200, reply.text
    body = _result(http, reply.json()["request_id"])
    (output,) = body["loss_fn_outputs"]
    assert output["logprobs"]["dtype"] == "float32" and output["logprobs"]["shape"] == [19]
    np.testing.assert_allclose(
        output["logprobs"]["data"], expected.loss_fn_outputs[0]["logprobs"].tolist(), atol=1e-6
    )
    assert body["metrics"]["loss:sum"] == pytest.approx(expected.metrics["loss:sum"], rel=1e-6)
    assert body["loss_fn_output_type"] == "ArrayRecord"


def test_a_json_forward_backward_with_a_boolean_config(dave, http):
    """0.16.1 sends ``loss_fn_config`` values as JSON; upstream's ``disable_lora: True`` too."""
    reply = http.post(
        "/forward_backward",
        json={
            "forward_backward_input": {
                "data": [_datum_json()],
                "loss_fn": "cross_entropy",
                "loss_fn_config": {"disable_lora": True},
            },
            "model_id": dave.model_id,
            "seq_id": 1,
        },
    )
    assert reply.status_code == 200, reply.text
    body = _result(http, reply.json()["request_id"])
    logprobs = np.asarray(body["loss_fn_outputs"][0]["logprobs"]["data"])
    expected = -float((logprobs * np.asarray(WEIGHTS)).sum())
    assert body["metrics"]["loss:sum"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"forward_input": {"data": [], "loss_fn": "cross_entropy"}},
            "needs forward_backward_input",
        ),
        (
            {"forward_backward_input": {"data": [{"model_input": {}}], "loss_fn": "cross_entropy"}},
            "data\\[0\\].model_input needs a list of chunks",
        ),
        (
            {
                "forward_backward_input": {
                    "data": [
                        {
                            "model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
                            "loss_fn_inputs": {"target_tokens": {"data": [2, 3], "dtype": "int8"}},
                        }
                    ],
                    "loss_fn": "cross_entropy",
                }
            },
            "unsupported dtype 'int8'",
        ),
    ],
)
def test_a_malformed_json_body_is_a_400_naming_the_field(dave, http, body, message):
    reply = http.post("/forward_backward", json={**body, "model_id": dave.model_id, "seq_id": 1})
    assert reply.status_code == 400
    assert message.replace("\\", "") in reply.json()["error"]
