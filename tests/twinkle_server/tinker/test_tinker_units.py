"""Pieces of the Tinker compatibility layer on their own: datum conversion, wire format, SDK patch."""

from __future__ import annotations

import numpy as np
import pytest
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import (
    deserialize_forward_backward_output,
    deserialize_sample_response,
)

from twinkle.server.common import datum_to_input_feature, input_feature_to_datum
from twinkle.server.tinker import convert as tinker_convert
from twinkle.server.tinker import wire as tinker_wire
from twinkle.server.web.errors import BadRequest
from twinkle_client.tinker_compat import tinker_api_key, to_tinker_path


def test_input_feature_to_datum_shifts_once_and_round_trips():
    feature = {"input_ids": np.array([5, 6, 7, 8, 9]), "labels": np.array([-100, -100, 7, 8, 9])}
    datum = input_feature_to_datum(feature)
    assert datum.model_input.to_ints() == [5, 6, 7, 8]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == [6, 7, 8, 9]
    assert datum.loss_fn_inputs["weights"].tolist() == [0.0, 1.0, 1.0, 1.0]
    back = datum_to_input_feature(datum)
    np.testing.assert_array_equal(back["input_ids"], feature["input_ids"])
    np.testing.assert_array_equal(back["labels"], feature["labels"])
    with pytest.raises(ValueError):
        input_feature_to_datum({"input_ids": [1, 2, 3], "labels": [1, 2]})


def test_forward_backward_request_decodes_from_the_sdk_encoding_with_zstd():
    import zstandard

    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [0.0, 1.0, 0.5]},
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[datum], loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.7}
        ),
        model_id="m",
        seq_id=3,
    )
    body = zstandard.ZstdCompressor().compress(
        forward_backward_request_to_proto(request).SerializeToString()
    )
    msg = tinker_wire.decode_forward_backward(tinker_wire.decompress(body, "zstd", 1 << 20))
    assert (msg.model_id, msg.seq_id, msg.loss_fn, msg.loss_fn_config) == (
        "m",
        3,
        "ppo",
        {"clip_low_threshold": 0.7},
    )
    assert msg.data[0].tokens == [1, 2, 3]
    assert msg.data[0].inputs["target_tokens"].tolist() == [2, 3, 4]
    with pytest.raises(BadRequest, match="logprobs"):
        tinker_convert.datums_to_features(msg.data, "ppo", 100)
    with pytest.raises(BadRequest, match="over the limit"):
        tinker_wire.decompress(zstandard.ZstdCompressor().compress(b"x" * 100), "zstd", 10)


def test_results_encode_to_what_the_sdk_decodes():
    out = deserialize_forward_backward_output(
        tinker_wire.encode_forward_backward_output(
            [{"logprobs": np.array([-1.0, -2.0])}, {"logprobs": np.array([-3.0])}],
            {"loss:sum": 6.0},
        )
    )
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-1.0, -2.0], [-3.0]]
    assert out.metrics == {"loss:sum": 6.0}
    sample = deserialize_sample_response(
        tinker_wire.encode_sample_response(
            [{"tokens": [4, 5], "logprobs": [-0.5, -0.25], "stop_reason": "length"}], [None, -1.5]
        )
    )
    assert sample.sequences[0].tokens == [4, 5] and sample.sequences[0].stop_reason == "length"
    assert sample.sequences[0].logprobs == [-0.5, -0.25]
    assert sample.prompt_logprobs == [None, -1.5]


def test_lora_flags_map_to_target_modules():
    config = tinker_convert.lora_config(
        {"rank": 4, "train_mlp": False, "train_attn": True, "train_unembed": False}
    )
    assert (
        config["r"] == 4
        and "q_proj" in config["target_modules"]
        and "up_proj" not in config["target_modules"]
    )
    assert tinker_convert.lora_flags(config) == {
        "lora_rank": 4,
        "train_attn": True,
        "train_mlp": False,
        "train_unembed": False,
    }
    with pytest.raises(BadRequest):
        tinker_convert.lora_config({"rank": 0})


def test_sdk_patch_helpers():
    assert tinker_api_key("abc") == "tml-abc" and tinker_api_key("tml-abc") == "tml-abc"
    assert to_tinker_path("twinkle://r/weights/x") == "tinker://r/weights/x"
    assert to_tinker_path("tinker://r/weights/x") == "tinker://r/weights/x"


def test_init_tinker_client_is_idempotent_and_accepts_twinkle_paths(monkeypatch):
    from twinkle import init_tinker_client

    monkeypatch.setenv("TWINKLE_SERVER_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("TINKER_BASE_URL", "placeholder")
    init_tinker_client()
    init_tinker_client()
    import os

    assert os.environ["TINKER_BASE_URL"] == "http://127.0.0.1:1"
    parsed = types.ParsedCheckpointTinkerPath.from_tinker_path("twinkle://run-1/weights/step")
    assert parsed.training_run_id == "run-1" and parsed.checkpoint_id == "weights/step"
    from tinker.lib._auth_token_provider import ApiKeyAuthProvider

    assert ApiKeyAuthProvider("plain-key").api_key == "tml-plain-key"


def test_init_tinker_compat_client_fails_fast_on_an_unreachable_server(monkeypatch):
    """ModelScope Twinkle's ``init_tinker_compat_client``: a ServiceClient for a reachable
    server; an unreachable one is a clear error at once (the SDK would retry for minutes)."""
    import socket
    import time

    from twinkle_client import init_tinker_compat_client

    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # bound, never listening: connections are refused
        start = time.monotonic()
        with pytest.raises(
            ConnectionError, match=f"cannot reach the Tinker server at http://127.0.0.1:{closed}"
        ):
            init_tinker_compat_client(base_url=f"http://127.0.0.1:{closed}", api_key="k")
        assert time.monotonic() - start < 10
