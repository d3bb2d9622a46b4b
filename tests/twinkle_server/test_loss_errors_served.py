"""Loss mistakes through the served model app are 400s naming the argument, and the upstream
DPO flow (reference pass with ``disable_lora``, then ``ref_outputs``) runs over HTTP."""

from __future__ import annotations

import asyncio
import math

from twinkle.server.testing import client, local_server

MODEL = "/api/v1/model/tiny/qwen3"
ROWS = [
    {"input_ids": [11, 12, 13, 14, 15, 16], "labels": [-100, -100, -100, 14, 15, 16]},
    {"input_ids": [11, 12, 13, 24, 25], "labels": [-100, -100, -100, 24, 25]},
]


def _run(tmp_path, steps):
    server = local_server(tmp_path)

    async def scenario():
        async with client(server, "alice") as alice:
            r = await alice.post(
                f"{MODEL}/add_adapter_to_model", json={"adapter_name": "a", "config": {"r": 4}}
            )
            assert r.status_code == 200, r.text
            return [await alice.post(f"{MODEL}/{op}", json=body) for op, body in steps]

    return asyncio.run(scenario())


def test_loss_mistakes_are_400s_naming_the_argument(tmp_path):
    bad_kwarg, good, no_advantages = _run(
        tmp_path,
        [
            ("set_loss", {"adapter_name": "a", "loss": "DPOLoss", "reference_fre": False}),
            ("set_loss", {"adapter_name": "a", "loss": "GRPOLoss", "epsilon": 0.2}),
            ("forward_backward", {"adapter_name": "a", "inputs": ROWS}),
        ],
    )
    assert (bad_kwarg.status_code, bad_kwarg.json()["category"]) == (400, "user"), bad_kwarg.text
    assert "reference_fre" in bad_kwarg.json()["error"]
    assert good.status_code == 200, good.text
    assert no_advantages.status_code == 400, no_advantages.text
    assert "advantages" in no_advantages.json()["error"]


def test_dpo_reference_pass_and_ref_outputs_over_http(tmp_path):
    server = local_server(tmp_path)

    async def scenario():
        async with client(server, "alice") as alice:
            for op, body in [
                ("add_adapter_to_model", {"adapter_name": "a", "config": {"r": 4}}),
                ("set_loss", {"adapter_name": "a", "loss": "DPOLoss", "reference_free": False}),
            ]:
                r = await alice.post(f"{MODEL}/{op}", json=body)
                assert r.status_code == 200, r.text
            ref = await alice.post(
                f"{MODEL}/forward_only",
                json={"adapter_name": "a", "inputs": ROWS, "disable_lora": True},
            )
            assert ref.status_code == 200, ref.text
            result = ref.json()["result"]
            out = await alice.post(
                f"{MODEL}/forward_backward",
                json={"adapter_name": "a", "inputs": ROWS, "ref_outputs": result},
            )
            bad = await alice.post(
                f"{MODEL}/forward_backward",
                json={"adapter_name": "a", "inputs": ROWS, "ref_outputs": {"logprobs": [[0.0]]}},
            )
            return result, out, bad

    result, out, bad = asyncio.run(scenario())
    assert [len(row) for row in result["logprobs"]] == [3, 2]  # one per trained token
    assert out.status_code == 200, out.text
    # A fresh adapter (B = 0) is the base model: policy and reference agree, loss = log 2.
    assert abs(out.json()["result"]["loss"] - math.log(2)) < 1e-5
    assert bad.status_code == 400 and "ref_outputs" in bad.json()["error"], bad.text
