"""Bad input on every application's routes: each case is a 4xx in time, names the field, leaks
nothing and changes no state (store, storage files, adapter weights/grads/optimizer, datasets).

The catalogue: malformed JSON, wrong types and shapes, NaN/Infinity (Python's json accepts the
literals), huge and negative numbers, token ids out of vocabulary, mismatched lengths, empty
batches, oversized bodies, zstd/gzip bombs on the protobuf route, deep nesting, unicode and path
tricks in every name, another tenant's records, and a symlink planted in storage.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from _bad_input_cases import MODEL, PROCESSOR, SAMPLER, Case, check, world
from _bad_input_catalogue import JSON, NAME_FIELDS, NAMES, V1, common_catalogue


def _native_cases() -> list[Case]:
    def op(name, label, mentions, body=None, content=None, url=MODEL, status=None):
        return Case(
            f"{url.rsplit('/', 1)[-1]} {name} {label}",
            "POST",
            f"{url}/{name}",
            mentions,
            json=body,
            content=content,
            headers=JSON if content else {},
            status=status,
        )

    feats = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}]
    cases = [
        op(
            "forward_backward",
            "empty batch",
            ("inputs",),
            {"adapter_name": "default", "inputs": []},
        ),
        op(
            "forward_backward",
            "out of vocab",
            ("input_ids", "token", "vocab"),
            {"adapter_name": "default", "inputs": [{"input_ids": [10**9, 2], "labels": [1, 2]}]},
        ),
        op(
            "forward_backward",
            "negative ids",
            ("input_ids", "token", "vocab"),
            {"adapter_name": "default", "inputs": [{"input_ids": [-3, 2], "labels": [1, 2]}]},
        ),
        op(
            "forward_backward",
            "NaN advantages",
            ("advantages", "nan", "finite"),
            content=b'{"adapter_name": "default", "inputs": [{"input_ids": [1, 2, 3], '
            b'"labels": [1, 2, 3]}], "advantages": [NaN]}',
        ),
        op(
            "forward_backward",
            "ids str",
            ("input_ids",),
            {"adapter_name": "default", "inputs": [{"input_ids": "abc"}]},
        ),
        op(
            "forward_backward",
            "bob's adapter",
            ("adapter",),
            {"adapter_name": "../bob/default", "inputs": feats},
        ),
        op(
            "add_adapter_to_model",
            "rank negative",
            ("r", "rank"),
            {"adapter_name": "x1", "config": {"r": -1}},
        ),
        op(
            "add_adapter_to_model",
            "rank huge",
            ("r", "rank"),
            {"adapter_name": "x2", "config": {"r": 10**9}},
        ),
        op(
            "set_optimizer",
            "lr NaN",
            ("lr", "nan", "finite"),
            content=b'{"adapter_name": "default", "optimizer": "Adam", "lr": NaN}',
        ),
        op(
            "set_optimizer",
            "unknown optimizer",
            ("optimizer",),
            {"adapter_name": "default", "optimizer": "os.system"},
        ),
        op(
            "load",
            "bob's checkpoint",
            ("not found", "checkpoint"),
            {"adapter_name": "default", "path": "{bob_ckpt}"},
        ),
        op("no_such_op", "unknown op", ("operation", "no_such_op")),
        op("sample", "empty inputs", ("inputs",), {"inputs": []}, url=SAMPLER),
        op(
            "sample",
            "temperature str",
            ("temperature",),
            {"inputs": [[1, 2]], "sampling_params": {"temperature": "hot"}},
            url=SAMPLER,
        ),
        op(
            "sample",
            "num_samples huge",
            ("num_samples",),
            {"inputs": [[1, 2]], "sampling_params": {"num_samples": 10**7}},
            url=SAMPLER,
        ),
        op(
            "sample",
            "max_tokens huge",
            ("max_tokens",),
            {"inputs": [[1, 2]], "sampling_params": {"max_tokens": 10**9}},
            url=SAMPLER,
        ),
        op(
            "sample",
            "bob's adapter",
            ("not found", "checkpoint"),
            {"inputs": [[1, 2]], "adapter_uri": "{bob_ckpt}"},
            url=SAMPLER,
        ),
        op("rows", "unknown dataset", ("dataset",), {"dataset": "../x"}, url=PROCESSOR),
        op("create_dataset", "meta list", ("dataset_meta",), {"dataset_meta": [1]}, url=PROCESSOR),
    ]
    for name in NAMES:
        cases.append(
            op(
                "add_adapter_to_model",
                f"name {name[:12]!r}",
                ("adapter_name", "adapter"),
                {"adapter_name": name, "config": {"r": 4}},
            )
        )
        cases.append(
            op(
                "save",
                f"name {name[:12]!r}",
                NAME_FIELDS,
                {"adapter_name": "default", "name": name},
            )
        )
        cases.append(
            op(
                "load",
                f"path {name[:12]!r}",
                NAME_FIELDS,
                {"adapter_name": "default", "path": f"twinkle://{{alice_run}}/weights/{name}"},
            )
        )
        cases.append(
            op(
                "create_dataset",
                f"dataset_id {name[:12]!r}",
                ("dataset_id", "dataset", "path", "not found"),
                {"dataset_meta": {"dataset_id": name or "/"}},
                url=PROCESSOR,
            )
        )
    return cases


def catalogue() -> list[Case]:
    return common_catalogue() + _native_cases()


def _report(outcomes) -> str:
    bad = [o for o in outcomes if o.problems]
    lines = [f"{len(bad)} of {len(outcomes)} bad-input cases failed:"]
    lines += [f"- {o.case.name}: {o.problems} ({o.status} {o.body[:160]!r})" for o in bad]
    return "\n".join(lines)


def test_every_bad_input_case_is_a_clean_4xx_that_changes_nothing():
    w = world()

    async def run_all():
        return [await check(w, case, w.ids) for case in catalogue()]

    outcomes = asyncio.run(run_all())
    assert not [o for o in outcomes if o.problems], _report(outcomes)
    assert len(outcomes) >= 300  # the count in the report; a shrinking catalogue is a regression


def test_a_symlink_planted_in_storage_does_not_reach_another_tenant():
    w = world()
    run_dir = next(p for p in w.storage.rglob(w.ids["alice_run"]) if p.is_dir())
    bob_ckpt = next(p for p in w.storage.rglob("ck-1") if w.ids["bob_run"] in str(p))
    link = run_dir / "weights" / "planted"
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(bob_ckpt, link)
    try:
        cases = [
            Case(
                "load planted",
                "POST",
                f"{MODEL}/load",
                NAME_FIELDS,
                json={"adapter_name": "default", "path": "twinkle://{alice_run}/weights/planted"},
            ),
            Case(
                "tinker load planted",
                "POST",
                f"{V1}/load_weights",
                NAME_FIELDS,
                json={
                    "model_id": "{alice_model}",
                    "seq_id": 900,
                    "path": "tinker://{alice_run}/weights/planted",
                },
            ),
            Case(
                "sample planted",
                "POST",
                f"{SAMPLER}/sample",
                NAME_FIELDS,
                json={"inputs": [[1, 2]], "adapter_uri": "twinkle://{alice_run}/weights/planted"},
            ),
        ]
        outcomes = asyncio.run(_run(w, cases))
        assert not [o for o in outcomes if o.problems], _report(outcomes)
    finally:
        link.unlink()


async def _run(w, cases):
    return [await check(w, case, w.ids) for case in cases]


def test_the_catalogue_is_json_serialisable_where_it_is_json():
    for case in catalogue():
        if case.json is not None:
            json.dumps(case.json, allow_nan=False)


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level("CRITICAL", logger="twinkle")
