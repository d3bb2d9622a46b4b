"""The bad-input catalogue (cases only; the oracle is :func:`_bad_input_cases.check`).

Malformed JSON, wrong types and shapes, NaN/Infinity (Python's json accepts the literals), huge
and negative numbers, token ids out of vocabulary, mismatched lengths, empty batches, oversized
bodies, zstd/gzip bombs on the protobuf route, deep nesting, unicode and path tricks in every
name, and other tenants' records, over the gateway (Twinkle and Tinker), model, sampler and
processor applications.
"""

from __future__ import annotations

import gzip

import zstandard
from _bad_input_cases import MODEL, PROCESSOR, SAMPLER, Case
from _bad_input_fixed import fixed_defects

from twinkle.server.web.http import DEFAULT_MAX_REQUEST_BYTES

V1 = "/api/v1"
JSON = {"content-type": "application/json"}
PROTO = {"content-type": "application/x-protobuf"}
NAME_FIELDS = ("name", "path", "adapter", "checkpoint", "not found", "invalid", "forbidden")
# Name tricks tried in every name field (checkpoint, run, adapter, dataset).
NAMES = [
    "../escape",
    "../../../../etc/passwd",
    "/etc/passwd",
    "%2e%2e%2fescape",
    "..",
    "a/../../b",
    "nul\x00byte",
    "\u202eevil",
    "\ud800",
    "",
    "x" * 5000,
]


def raw(obj_text: str) -> bytes:
    return obj_text.encode()


def _json_routes() -> list[tuple[str, str]]:
    """Every route that reads a JSON object body (method, url)."""
    gateway = [
        "create_session",
        "session_heartbeat",
        "create_model",
        "get_info",
        "optim_step",
        "unload_model",
        "save_weights",
        "save_weights_for_sampler",
        "load_weights",
        "weights_info",
        "create_sampling_session",
        "asample",
        "retrieve_future",
        "sessions/search",
    ]
    model = ["forward_backward", "add_adapter_to_model", "set_optimizer", "save", "load"]
    return (
        [("POST", f"{V1}/{r}") for r in gateway]
        + [("POST", f"{MODEL}/{op}") for op in model]
        + [("POST", f"{SAMPLER}/sample"), ("POST", f"{PROCESSOR}/create_dataset")]
    )


def _malformed_bodies() -> list[Case]:
    deep = "[" * 200_000 + "]" * 200_000
    deep_obj = '{"a":' * 100_000 + "1" + "}" * 100_000
    bodies = [
        ("malformed", b'{"a": ', ("malformed", "JSON")),
        ("list", b"[1, 2]", ("object",)),
        ("not-utf8", b'{"a": "\xff\xfe"}', ("malformed", "JSON")),
        ("deep-list", deep.encode(), ("nested",)),
        ("deep-object", deep_obj.encode(), ("nested",)),
        ("nan", b'{"session_id": NaN, "x": NaN}', ("nan", "finite")),
        ("infinity", b'{"x": [1, -Infinity]}', ("inf", "finite")),
        ("overflow", b'{"x": 1e999}', ("inf", "finite")),
    ]
    return [
        Case(f"{url} {label}", method, url, mentions, content=body, headers=JSON)
        for method, url in _json_routes()
        for label, body, mentions in bodies
    ]


def _sampling_cases() -> list[Case]:
    prompt = {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]}

    def sample(label, mentions, params=None, **fields):
        body = {
            "sampling_session_id": "{alice_sampler}",
            "seq_id": 10_000 + len(label),
            "num_samples": 1,
            "prompt": prompt,
            "sampling_params": {"max_tokens": 2, **(params or {})},
            **fields,
        }
        return Case(f"asample {label}", "POST", f"{V1}/asample", mentions, json=body)

    nan = (
        b'{"sampling_session_id": "{alice_sampler}", "seq_id": 1, "prompt": {"chunks": '
        b'[{"tokens": [1]}]}, "sampling_params": {"temperature": NaN, "max_tokens": 2}}'
    )
    return [
        Case(
            "asample temperature NaN",
            "POST",
            f"{V1}/asample",
            ("temperature",),
            content=nan,
            headers=JSON,
        ),
        sample("num_samples huge", ("num_samples",), num_samples=10_000_000),
        sample("num_samples zero", ("num_samples",), num_samples=0),
        sample("num_samples str", ("num_samples",), num_samples="3"),
        sample("max_tokens huge", ("max_tokens",), {"max_tokens": 10**9}),
        sample("max_tokens negative", ("max_tokens",), {"max_tokens": -1}),
        sample("max_tokens float", ("max_tokens",), {"max_tokens": 2.5}),
        sample("temperature negative", ("temperature",), {"temperature": -1.0}),
        sample("temperature str", ("temperature",), {"temperature": "hot"}),
        sample("top_p zero", ("top_p",), {"top_p": 0.0}),
        sample("top_p above one", ("top_p",), {"top_p": 1.5}),
        sample("top_k below -1", ("top_k",), {"top_k": -5}),
        sample("seed str", ("seed",), {"seed": "abc"}),
        sample("stop number", ("stop",), {"stop": 5}),
        sample("params list", ("sampling_params",), sampling_params=[1]),
        sample("topk negative", ("topk_sample_logprobs",), topk_sample_logprobs=-1),
        sample("token out of vocab", ("prompt", "token"), prompt={"chunks": [{"tokens": [10**9]}]}),
        sample("token negative", ("prompt", "token"), prompt={"chunks": [{"tokens": [-1]}]}),
        sample("token str", ("tokens",), prompt={"chunks": [{"tokens": ["a"]}]}),
        sample("empty prompt", ("prompt",), prompt={"chunks": []}),
        sample("chunks not a list", ("prompt", "chunks"), prompt={"chunks": 5}),
        sample("session id int", ("sampling_session_id",), sampling_session_id=5),
        sample("bob's sampler", ("not found",), sampling_session_id="{bob_session}:sample:0"),
        sample(
            "last_n huge",
            ("prompt_logprobs_last_n",),
            prompt_logprobs=True,
            prompt_logprobs_last_n=99,
        ),
    ]


def _datum(tokens, targets, **inputs):
    from tinker import types

    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": targets, **inputs},
    )


def _fb(data, loss_fn="cross_entropy", model_id="{alice_model}", **config):
    """A ForwardBackwardRequest built at send time (``model_id`` may name a world id)."""
    return lambda ids: _fb_bytes(data, loss_fn, model_id.format(**ids), **config)


def _fb_bytes(data, loss_fn, model_id, **config) -> bytes:
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn=loss_fn, loss_fn_config=config or None
        ),
        model_id=model_id,
        seq_id=1,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def _protobuf_cases() -> list[Case]:
    url = f"{V1}/forward_backward"
    nan = float("nan")
    good = [_datum([1, 2, 3], [2, 3, 4], weights=[1.0, 1.0, 1.0])]
    ppo = {"logprobs": [-1.0, -1.0, -1.0]}

    def fb(label, mentions, body, headers=PROTO, status=None):
        return Case(
            f"forward_backward {label}",
            "POST",
            url,
            mentions,
            content=body,
            headers=headers,
            status=status,
        )

    bomb = zstandard.ZstdCompressor().compress(b"\0" * (DEFAULT_MAX_REQUEST_BYTES + 1024))
    return [
        fb("garbage", ("protobuf",), b"\xff\x00garbage"),
        # SDKs before 0.27 send JSON: an empty one misses the SDK's own field.
        fb("json content type", ("forward_backward_input",), b"{}", JSON),
        fb("zstd bomb", ("over the limit",), bomb, {**PROTO, "content-encoding": "zstd"}),
        fb(
            "zstd garbage",
            ("zstd",),
            b"\x28\xb5\x2f\xfd garbage",
            {**PROTO, "content-encoding": "zstd"},
        ),
        fb(
            "gzip bomb",
            ("content-encoding",),
            gzip.compress(b"\0" * (1 << 24)),
            {**PROTO, "content-encoding": "gzip"},
        ),
        fb("empty batch", ("datum",), _fb([])),
        fb("empty tokens", ("model_input", "empty"), _fb([_datum([], [])])),
        fb("token out of vocab", ("model_input", "token"), _fb([_datum([10**8, 2], [2, 3])])),
        fb("negative token", ("model_input", "token"), _fb([_datum([-4, 2], [2, 3])])),
        fb("target out of vocab", ("target_tokens",), _fb([_datum([1, 2], [2, 10**8])])),
        fb("mismatched lengths", ("target_tokens", "values"), _fb([_datum([1, 2, 3], [2, 3])])),
        fb("NaN weights", ("weights", "finite"), _fb([_datum([1, 2], [2, 3], weights=[nan, 1.0])])),
        fb(
            "NaN advantages (importance_sampling)",
            ("advantages", "finite"),
            _fb(
                [_datum([1, 2, 3], [2, 3, 4], advantages=[nan, 0.0, 1.0], **ppo)],
                "importance_sampling",
            ),
        ),
        fb(
            "Inf advantages (ppo)",
            ("advantages", "finite"),
            _fb([_datum([1, 2, 3], [2, 3, 4], advantages=[float("inf"), 0.0, 1.0], **ppo)], "ppo"),
        ),
        fb(
            "NaN logprobs (ppo)",
            ("logprobs", "finite"),
            _fb([_datum([1, 2, 3], [2, 3, 4], advantages=[1.0] * 3, logprobs=[nan] * 3)], "ppo"),
        ),
        fb(
            "NaN clip (ppo)",
            ("clip_low_threshold", "finite"),
            _fb(
                [_datum([1, 2, 3], [2, 3, 4], advantages=[1.0] * 3, **ppo)],
                "ppo",
                clip_low_threshold=nan,
            ),
        ),
        fb(
            "missing advantages", ("advantages",), _fb([_datum([1, 2, 3], [2, 3, 4], **ppo)], "ppo")
        ),
        fb("unknown loss", ("loss_fn",), _fb(good, "nope")),
        fb("bob's model", ("not found", "model"), _fb(good, model_id="{bob_session}:train:0")),
        fb("model id traversal", ("not found", "model"), _fb(good, model_id="../../etc")),
    ]


def _tinker_json_cases() -> list[Case]:
    def post(route, label, mentions, body, status=None):
        return Case(f"{route} {label}", "POST", f"{V1}/{route}", mentions, json=body, status=status)

    model = "{alice_model}"
    cases = [
        post(
            "create_model",
            "seq str",
            ("model_seq_id",),
            {"session_id": "{alice_session}", "model_seq_id": "0", "base_model": "tiny/qwen3"},
        ),
        post(
            "create_model",
            "rank negative",
            ("rank",),
            {
                "session_id": "{alice_session}",
                "model_seq_id": 5,
                "base_model": "tiny/qwen3",
                "lora_config": {"rank": -1},
            },
        ),
        post(
            "create_model",
            "rank huge",
            ("rank",),
            {
                "session_id": "{alice_session}",
                "model_seq_id": 6,
                "base_model": "tiny/qwen3",
                "lora_config": {"rank": 10**9},
            },
        ),
        post(
            "create_model",
            "bob's session",
            ("not found", "session"),
            {"session_id": "{bob_session}", "model_seq_id": 7, "base_model": "tiny/qwen3"},
        ),
        post(
            "create_model",
            "unknown base model",
            ("base model",),
            {"session_id": "{alice_session}", "model_seq_id": 8, "base_model": "../x"},
        ),
        post("get_info", "bob's model", ("not found",), {"model_id": "{bob_session}:train:0"}),
        post("get_info", "model id int", ("model_id", "not found"), {"model_id": 5}),
        post(
            "optim_step",
            "lr negative",
            ("learning_rate", "lr"),
            {"model_id": model, "seq_id": 50, "adam_params": {"learning_rate": -1.0}},
        ),
        post(
            "optim_step",
            "lr str",
            ("learning_rate", "lr"),
            {"model_id": model, "seq_id": 51, "adam_params": {"learning_rate": "fast"}},
        ),
        post(
            "optim_step",
            "beta above one",
            ("beta",),
            {"model_id": model, "seq_id": 52, "adam_params": {"beta1": 2.0}},
        ),
        post("retrieve_future", "id int", ("request_id",), {"request_id": 5}),
        post(
            "retrieve_future",
            "bob's future",
            ("not found", "request"),
            {"request_id": "req-00000000000000000000000000000000"},
        ),
        post("session_heartbeat", "missing", ("session_id",), {}),
        post(
            "session_heartbeat", "bob's", ("not found", "session"), {"session_id": "{bob_session}"}
        ),
        post(
            "load_weights",
            "bob's checkpoint",
            ("not found", "checkpoint"),
            {"model_id": model, "seq_id": 60, "path": "{bob_ckpt}"},
        ),
        post(
            "weights_info",
            "bob's checkpoint",
            ("not found", "checkpoint"),
            {"tinker_path": "{bob_ckpt}"},
        ),
    ]
    for i, name in enumerate(NAMES):
        cases.append(
            post(
                "save_weights",
                f"name {name[:12]!r}",
                NAME_FIELDS,
                {"model_id": model, "seq_id": 100 + i, "path": name or None}
                if name
                else {"model_id": model, "seq_id": 100 + i, "path": "a" * 5000},
            )
        )
        cases.append(
            post(
                "load_weights",
                f"path {name[:12]!r}",
                NAME_FIELDS + ("tinker://",),
                {
                    "model_id": model,
                    "seq_id": 200 + i,
                    "path": f"tinker://{{alice_run}}/weights/{name}",
                },
            )
        )
        cases.append(
            post(
                "create_sampling_session",
                f"model_path {name[:12]!r}",
                NAME_FIELDS + ("tinker://",),
                {
                    "session_id": "{alice_session}",
                    "sampling_session_seq_id": 300 + i,
                    "model_path": f"tinker://{name}/weights/x",
                },
            )
        )
    return cases


def _common_cases() -> list[Case]:
    def get(url, label, mentions, status=None):
        return Case(f"GET {url} {label}", "GET", url, mentions, status=status)

    cases = [
        get(f"{V1}/training_runs/{{bob_run}}", "bob's run", ("not found",), 404),
        get(
            f"{V1}/training_runs/{{bob_run}}/checkpoints", "bob's checkpoints", ("not found",), 404
        ),
        get(f"{V1}/training_runs?limit=-1", "negative limit", ("limit",)),
        get(f"{V1}/training_runs?limit=abc", "limit str", ("limit",)),
        get(f"{V1}/training_runs?offset=-5", "negative offset", ("offset",)),
        get(f"{V1}/training_runs?limit=99999999999999999999", "huge limit", ("limit",)),
        Case(
            "finish bob's session",
            "POST",
            f"{V1}/sessions/{{bob_session}}/finish",
            ("not found", "session"),
            json={},
            status=404,
        ),
        Case(
            "delete bob's checkpoint",
            "DELETE",
            f"{V1}/training_runs/{{bob_run}}/checkpoints/weights/ck-1",
            ("not found",),
            status=404,
        ),
        Case(
            "ttl NaN",
            "PUT",
            f"{V1}/training_runs/{{alice_run}}/checkpoints/weights/ck-1/ttl",
            ("ttl_seconds", "nan", "finite"),
            content=b'{"ttl_seconds": NaN}',
            headers=JSON,
        ),
        Case(
            "ttl negative",
            "PUT",
            f"{V1}/training_runs/{{alice_run}}/checkpoints/weights/ck-1/ttl",
            ("ttl_seconds",),
            json={"ttl_seconds": -1},
        ),
        Case(
            "ttl str",
            "PUT",
            f"{V1}/training_runs/{{alice_run}}/checkpoints/weights/ck-1/ttl",
            ("ttl_seconds",),
            json={"ttl_seconds": "soon"},
        ),
        Case(
            "oversized body",
            "POST",
            f"{V1}/create_session",
            ("over the limit",),
            content=b'{"tags": ["' + b"x" * (DEFAULT_MAX_REQUEST_BYTES + 10) + b'"]}',
            headers=JSON,
            status=413,
        ),
        Case("no key", "GET", f"{V1}/training_runs", ("API key",), who=None, status=401),
    ]
    # (a raw ".." segment is resolved by the HTTP client before it is sent)
    for name in ["%2e%2e", "..%2f..%2fetc", "%00", "\u202e"]:
        for kind in ("weights", "%2e%2e"):
            cases.append(
                Case(
                    f"delete {kind}/{name!r}",
                    "DELETE",
                    f"{V1}/training_runs/{{alice_run}}/checkpoints/{kind}/{name}",
                    ("not found", "checkpoint", "invalid", "name", "kind"),
                )
            )
            cases.append(
                Case(
                    f"delete run {name!r}",
                    "DELETE",
                    f"{V1}/training_runs/{name}/checkpoints/weights/ck-1",
                    ("not found", "run", "invalid"),
                )
            )
    return cases


def common_catalogue() -> list[Case]:
    return (
        fixed_defects()
        + _malformed_bodies()
        + _sampling_cases()
        + _protobuf_cases()
        + _tinker_json_cases()
        + _common_cases()
    )
