"""The client's LazyDataset / PackingDataset / IterableDataset / IterablePackingDataset over a
live processor give what the library's give locally; preference rows come back paired."""

from __future__ import annotations

import pytest
from serving import KEYS, MODEL_ID, TEMPLATE

from twinkle_client import init_twinkle_client
from twinkle_client.data_format import InputFeature
from twinkle_client.dataloader import DataLoader
from twinkle_client.dataset import (
    DatasetMeta,
    IterableDataset,
    IterablePackingDataset,
    LazyDataset,
    PackingDataset,
)

ROWS = [
    {
        "messages": [
            {"role": "user", "content": f"Count to {i}."},
            {"role": "assistant", "content": " ".join(map(str, range(1, i + 1)))},
        ]
    }
    for i in range(1, 9)
]
DPO = [{"prompt": f"Hi {i}", "answer_zh": f"你好 {i}", "answer_en": f"Hello {i}"} for i in range(3)]


@pytest.fixture
def alice(live):
    client = init_twinkle_client(base_url=live[0], api_key=KEYS["alice"], timeout=120)
    yield client
    client.close()


def _local(cls, rows=ROWS, **kwargs):
    import twinkle.dataset as local

    dataset = getattr(local, cls)(local.DatasetMeta(data=rows), **kwargs)
    return dataset.set_template(TEMPLATE, model_id=MODEL_ID, max_length=64)


def _ids(items):
    return [f["input_ids"].tolist() for f in items]


def test_lazy_and_packing_match_local(alice):
    lazy = LazyDataset(DatasetMeta(data=ROWS)).set_template(TEMPLATE, model_id=MODEL_ID)
    lazy.encode()
    assert _ids(lazy) == _ids(_local("LazyDataset").encode())
    remote = PackingDataset(DatasetMeta(data=ROWS)).set_template(
        TEMPLATE, model_id=MODEL_ID, max_length=64
    )
    remote.encode()
    local = _local("PackingDataset").encode()
    assert len(remote) == len(local) < len(ROWS)
    assert _ids(remote) == _ids(local)
    assert [r["position_ids"].tolist() for r in remote] == [
        r["position_ids"].tolist() for r in local
    ]
    assert [len(b) for b in DataLoader(remote, batch_size=2)] == [2] * (len(local) // 2) + [1] * (
        len(local) % 2
    )


def test_streams_match_local(alice):
    stream = IterableDataset(DatasetMeta(data=ROWS)).set_template(
        TEMPLATE, model_id=MODEL_ID, max_length=64
    )
    stream.encode()
    assert not hasattr(stream, "__len__")
    assert _ids(stream) == _ids(_local("IterableDataset").encode())
    assert [len(b) for b in DataLoader(stream, batch_size=3)] == [3, 3, 2]
    packing = IterablePackingDataset(DatasetMeta(data=ROWS), packing_interval=3)
    packing.set_template(TEMPLATE, model_id=MODEL_ID, max_length=64).encode()
    local = _local("IterablePackingDataset", packing_interval=3).encode()
    assert _ids(packing) == _ids(local)


def test_preference_rows_come_back_as_pairs(alice):
    import twinkle.dataset as local_datasets

    remote = LazyDataset(DatasetMeta(data=DPO)).set_template(TEMPLATE, model_id=MODEL_ID)
    remote.map("EmojiDPOProcessor", init_args={"system": "Be kind."}).encode()
    local = local_datasets.Dataset(local_datasets.DatasetMeta(data=DPO))
    local.set_template(TEMPLATE, model_id=MODEL_ID)
    local.map("EmojiDPOProcessor", init_args={"system": "Be kind."}).encode()
    row = remote[1]
    assert set(row) == {"positive", "negative"}
    assert isinstance(row["positive"], InputFeature)
    for side in ("positive", "negative"):
        assert row[side]["input_ids"].tolist() == local[1][side]["input_ids"].tolist()
