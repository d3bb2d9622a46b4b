"""Remote datasets on the processor application: same rows as local, names only, per key."""

from __future__ import annotations

import numpy as np
import pytest
from serving import KEYS, MODEL_ID, TEMPLATE

from twinkle_client import TwinkleClient, init_twinkle_client
from twinkle_client.dataloader import DataLoader
from twinkle_client.dataset import Dataset, DatasetMeta
from twinkle_client.errors import (
    BadRequestError,
    NotFoundError,
    PermissionDeniedError,
    UnsupportedOperationError,
)

ROWS = [
    {
        "messages": [
            {"role": "user", "content": f"Count to {i}."},
            {"role": "assistant", "content": " ".join(map(str, range(i)))},
        ]
    }
    for i in range(1, 7)
]


@pytest.fixture
def alice(live):
    client = init_twinkle_client(base_url=live[0], api_key=KEYS["alice"], timeout=120)
    yield client
    client.close()


def test_in_memory_rows_encode_exactly_as_locally(alice):
    from twinkle.dataset import Dataset as LocalDataset
    from twinkle.dataset import DatasetMeta as LocalMeta

    remote = Dataset(DatasetMeta(data=ROWS)).set_template(
        TEMPLATE, model_id=MODEL_ID, max_length=64
    )
    local = LocalDataset(LocalMeta(data=ROWS)).set_template(
        TEMPLATE, model_id=MODEL_ID, max_length=64
    )
    assert remote.template == TEMPLATE and len(remote) == 6 and remote.column_names == ["messages"]
    assert remote[0] == local[0]
    remote.encode(batched=True, timeout=60)
    local.encode(batched=True)
    assert set(remote.column_names) == set(local.column_names)
    for i in range(len(local)):
        np.testing.assert_array_equal(remote[i]["input_ids"], local[i]["input_ids"])
        np.testing.assert_array_equal(remote[i]["labels"], local[i]["labels"])
    assert [f["input_ids"].tolist() for f in remote] == [f["input_ids"].tolist() for f in local]
    batch = next(iter(DataLoader(remote, batch_size=4)))
    assert len(batch) == 4 and batch[0]["input_ids"].dtype == np.int64


def test_slices_and_named_preprocessors(alice):
    picked = Dataset(DatasetMeta("builtin://self-cognition", data_slice=slice(2, 8, 2)))
    assert len(picked) == 3
    assert len(Dataset(DatasetMeta("builtin://self-cognition", data_slice=[0, 5, 10_000]))) == 2
    picked.map(
        "SelfCognitionProcessor", init_args={"model_name": "Twinkle", "model_author": "ModelScope"}
    )
    assert "messages" in picked.column_names
    with pytest.raises(BadRequestError, match="unknown preprocessor"):
        picked.map("NoSuchProcessor")


def test_code_is_never_sent(alice):
    dataset = Dataset(DatasetMeta(data=ROWS))
    with pytest.raises(UnsupportedOperationError, match="no code is sent"):
        dataset.map(lambda row: row)
    with pytest.raises(UnsupportedOperationError, match="no code is sent"):
        dataset.filter(lambda row: True)
    with pytest.raises(BadRequestError, match="runs no client code"):
        alice.call(alice.processor_route, "filter", {"dataset": dataset._handle})


def test_server_paths_and_other_keys_datasets_are_out_of_reach(alice, live, tmp_path):
    with pytest.raises(PermissionDeniedError, match="does not read local path"):
        Dataset(DatasetMeta(str(tmp_path)))
    mine = Dataset(DatasetMeta(data=ROWS))
    with TwinkleClient(base_url=live[0], api_key=KEYS["bob"], heartbeat_interval_s=None) as bob:
        with pytest.raises(NotFoundError, match="unknown dataset"):
            bob.call(bob.processor_route, "rows", {"dataset": mine._handle, "indices": [0]})
    with pytest.raises(BadRequestError, match="out of range"):
        mine.__getitems__([99])
    with pytest.raises(IndexError):
        mine[6]


def test_encode_with_a_generation_prompt_matches_the_local_dataset(alice):
    """``encode(add_generation_prompt=True)`` on the server ends each prompt with the assistant
    header, exactly as the local dataset does (upstream's GRPO scripts sample from such rows)."""
    from twinkle.dataset import Dataset as LocalDataset
    from twinkle.dataset import DatasetMeta as LocalMeta

    prompts = [{"messages": row["messages"][:1]} for row in ROWS]
    remote = Dataset(DatasetMeta(data=prompts)).set_template(TEMPLATE, model_id=MODEL_ID)
    local = LocalDataset(LocalMeta(data=prompts)).set_template(TEMPLATE, model_id=MODEL_ID)
    plain = LocalDataset(LocalMeta(data=prompts)).set_template(TEMPLATE, model_id=MODEL_ID)
    remote.encode(batched=True, add_generation_prompt=True, timeout=60)
    local.encode(batched=True, add_generation_prompt=True)
    plain.encode(batched=True)
    for i in range(len(local)):
        np.testing.assert_array_equal(remote[i]["input_ids"], local[i]["input_ids"])
    assert len(local[0]["input_ids"]) > len(plain[0]["input_ids"])
