"""The bad-input catalogue's regression cases: each 500 (or unclear 4xx) found by the catalogue or
by the schema fuzzer (tests/reliability/test_fuzz_schemas.py), kept here once fixed."""

from __future__ import annotations

from _bad_input_cases import BASE, MODEL, PROCESSOR, SAMPLER, Case

V1 = "/api/v1"


def fixed_defects() -> list[Case]:
    """500s found by this catalogue or by the schema fuzzer (tests/reliability/
    test_fuzz_schemas.py), each kept here once fixed."""
    features = {"adapter_name": "default", "inputs": [{"input_ids": [1, 2, 3], "labels": [1]}]}
    cases = [
        # InputFeature's ValueError on the model's thread
        Case(
            "native forward_backward labels shorter than input_ids",
            "POST",
            f"{MODEL}/forward_backward",
            ("labels",),
            json=features,
        ),
        # an IndexError in the torch sampler's forward pass
        Case(
            "native sample token out of vocab",
            "POST",
            f"{SAMPLER}/sample",
            ("token", "vocab", "input"),
            json={"inputs": [[10**9]]},
        ),
        Case(
            "native sample negative token",
            "POST",
            f"{SAMPLER}/sample",
            ("token", "vocab", "input"),
            json={"inputs": [[5, -1]]},
        ),
    ]
    # create_session and create_model read fields of the wrong type (fuzzer)
    for label, body, field in (
        ("tags bool", {"tags": True}, "tags"),
        ("tags of ints", {"tags": [1]}, "tags"),
        ("user_metadata list", {"user_metadata": [1]}, "user_metadata"),
        ("project_id int", {"project_id": 3}, "project_id"),
    ):
        cases.append(
            Case(f"create_session {label}", "POST", f"{V1}/create_session", (field,), body)
        )
    cases.append(
        Case(
            "create_model optimizer_config str",
            "POST",
            f"{V1}/create_model",
            ("optimizer_config",),
            json={
                "session_id": "{alice_session}",
                "model_seq_id": 77,
                "base_model": BASE,
                "optimizer_config": "adamw",
            },
        )
    )
    # the processor registry's ValueError/TypeError on the model's thread (fuzzer)
    for label, body in (
        ("empty name", {"processor": ""}),
        ("unknown name", {"processor": "os.system"}),
        ("unknown argument", {"processor": "InputProcessor", "no_such_arg": 1}),
    ):
        cases.append(
            Case(
                f"set_processor {label}",
                "POST",
                f"{MODEL}/set_processor",
                ("processor",),
                json={"adapter_name": "default", **body},
            )
        )
    # the at-length fuzz run (budget 25): fields of the wrong type reaching a str/hash
    cases += [
        Case(
            "session_heartbeat session_id float",
            "POST",
            f"{V1}/session_heartbeat",
            ("session_id",),
            json={"session_id": 0.0},
        ),
        Case(
            "session_heartbeat session_id object",
            "POST",
            f"{V1}/session_heartbeat",
            ("session_id",),
            json={"session_id": {"": None}},
        ),
        Case(
            "save_weights seq_id object",
            "POST",
            f"{V1}/save_weights",
            ("seq_id",),
            json={"model_id": "{alice_model}", "seq_id": {}, "path": "p"},
        ),
        Case(
            "save_weights_external seq_id list",
            "POST",
            f"{V1}/save_weights_external",
            ("seq_id",),
            json={"model_id": "{alice_model}", "seq_id": [1], "path": "p"},
        ),
        # An expiry beyond what a date can hold was stored, then broke every later listing of
        # the owner's checkpoints (GET /checkpoints: 500 until the record went); bools passed
        # as numbers (fuzzer, budget 75).
        Case(
            "ttl beyond any date",
            "PUT",
            f"{V1}/training_runs/{{alice_run}}/checkpoints/weights/ck-1/ttl",
            ("ttl_seconds",),
            json={"ttl_seconds": 1e300},
        ),
        Case(
            "ttl bool",
            "PUT",
            f"{V1}/training_runs/{{alice_run}}/checkpoints/weights/ck-1/ttl",
            ("ttl_seconds",),
            json={"ttl_seconds": True},
        ),
        Case(
            "save_weights ttl beyond any date",
            "POST",
            f"{V1}/save_weights",
            ("ttl_seconds",),
            json={"model_id": "{alice_model}", "seq_id": 1, "path": "p", "ttl_seconds": 1e300},
        ),
        Case(
            "save_weights_for_sampler ttl string",
            "POST",
            f"{V1}/save_weights_for_sampler",
            ("ttl_seconds",),
            json={"model_id": "{alice_model}", "seq_id": 1, "path": "p", "ttl_seconds": "1h"},
        ),
        Case(
            "save_weights model_id int",
            "POST",
            f"{V1}/save_weights",
            ("model_id",),
            json={"model_id": 7, "seq_id": 1, "path": "p"},
        ),
        Case(
            "native sample input_ids int",
            "POST",
            f"{SAMPLER}/sample",
            ("input",),
            json={"inputs": [{"input_ids": 5}]},
        ),
        Case(
            "processor create_dataset empty meta",
            "POST",
            f"{PROCESSOR}/create_dataset",
            ("dataset_meta", "dataset_id"),
            json={"dataset_meta": {}},
        ),
        Case(
            "create_sampling_session unknown base_model",
            "POST",
            f"{V1}/create_sampling_session",
            ("base_model",),
            json={"session_id": "{alice_session}", "sampling_session_seq_id": 9, "base_model": "x"},
            status=404,
        ),
        # Found by the fuzzer at budget 50 (eighteenth session): ids of the wrong JSON type
        # reached the state's key concatenation as 500s; messages that named no field.
        Case(
            "load_weights session_id bool",
            "POST",
            f"{V1}/load_weights",
            ("session_id",),
            json={"session_id": True, "model_seq_id": 3, "path": "{alice_ckpt}"},
        ),
        Case(
            "create_sampling_session session_id int",
            "POST",
            f"{V1}/create_sampling_session",
            ("session_id",),
            json={"session_id": 5, "sampling_session_seq_id": 9, "base_model": BASE},
        ),
        Case(
            "create_sampling_session base_model list",
            "POST",
            f"{V1}/create_sampling_session",
            ("base_model",),
            json={
                "session_id": "{alice_session}",
                "sampling_session_seq_id": 9,
                "base_model": [1.0, {"a": None}],
            },
        ),
        Case(
            "create_model optimizer_config unknown type",
            "POST",
            f"{V1}/create_model",
            ("optimizer_config",),
            json={
                "session_id": "{alice_session}",
                "model_seq_id": 78,
                "base_model": BASE,
                "optimizer_config": {"type": "\x175"},
            },
        ),
        Case(
            "tinker_save_external bad age recipient",
            "POST",
            f"{MODEL}/tinker_save_external",
            ("age_encryption_recipients",),
            json={"name": "n1", "age_encryption_recipients": ["a\u00f4r"]},
        ),
        # Starlette's plain-text "Not Found" for a path no route matches (an id holding '/')
        Case("samplers id with a slash", "GET", f"{V1}/samplers/a%2Fb", ("path",), status=404),
        Case(
            "archive name with a slash",
            "GET",
            f"{V1}/training_runs/{{alice_run}}/checkpoints/weights/a%2Fb/archive",
            ("path",),
            status=404,
        ),
    ]
    return cases
