"""LazyDataset, PackingDataset, IterableDataset, IterablePackingDataset, paired (DPO) rows,
``encode(add_generation_prompt=True)``, and DataLoader over streams."""

from __future__ import annotations

import numpy as np
import pytest

from twinkle.data_format import InputFeature, Message, Trajectory
from twinkle.dataloader import DataLoader
from twinkle.dataset import (
    Dataset,
    DatasetMeta,
    IterableDataset,
    IterablePackingDataset,
    LazyDataset,
    PackingDataset,
)
from twinkle.preprocessor import EmojiDPOProcessor, Preprocessor
from twinkle.template import Qwen3_5Template
from twinkle_client.dataset._packing import pack_features, pack_lengths

COUNT = [
    {
        "messages": [
            {"role": "user", "content": f"Count to {i}."},
            {"role": "assistant", "content": " ".join(map(str, range(1, i + 1)))},
        ]
    }
    for i in range(1, 9)
]
DPO = [
    {"prompt": f"Greet me {i}", "answer_zh": f"你好 {i} 😊", "answer_en": f"Hello {i}."}
    for i in range(5)
]


@pytest.fixture
def tpl(tokenizer):
    return Qwen3_5Template(tokenizer=tokenizer, max_length=64)


def test_pack_lengths_best_fit():
    assert pack_lengths([5, 3, 4, 2, 6, 1], 8) == [[0, 1], [2, 5], [3, 4]]
    assert pack_lengths([], 8) == []
    with pytest.raises(ValueError, match="sample 1 has 9 tokens"):
        pack_lengths([1, 9], 8)


def test_pack_features_restarts_positions():
    packed = pack_features(
        [
            {"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "advantages": [0.0, 1.0, 1.0]},
            {"input_ids": [4, 5], "labels": [4, 5], "advantages": [2.0, 2.0], "user_data": [1]},
        ]
    )
    assert packed["input_ids"].tolist() == [1, 2, 3, 4, 5]
    assert packed["labels"].tolist() == [-100, 2, 3, 4, 5]
    assert packed["position_ids"].tolist() == [0, 1, 2, 0, 1]
    assert packed["advantages"].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0]
    assert packed["length"] == 5 and "user_data" not in packed


def test_dpo_rows_encode_both_sides(tpl):
    ds = Dataset(DatasetMeta(data=DPO)).set_template(tpl)
    ds.map(EmojiDPOProcessor, init_args={"system": "Be kind."})
    assert ds.column_names == ["positive", "negative"]
    assert ds[0]["positive"]["messages"][2]["content"] == "你好 0 😊"
    ds.encode()
    row = ds[2]
    assert set(row) == {"positive", "negative"}
    assert all(isinstance(row[k], InputFeature) for k in row)
    chosen = tpl.decode(row["positive"]["input_ids"])
    rejected = tpl.decode(row["negative"]["input_ids"])
    assert chosen.endswith("你好 2 😊<|im_end|>\n") and rejected.endswith("Hello 2.<|im_end|>\n")
    assert chosen.startswith("<|im_start|>system\nBe kind.<|im_end|>")
    # The upstream DPO script's batch preparation, as written there.
    batch = next(iter(DataLoader(dataset=ds, batch_size=2)))
    pairs = []
    for item in batch:
        base = {k: v for k, v in item.items() if k not in ("positive", "negative")}
        pairs += [{**base, **item["positive"]}, {**base, **item["negative"]}]
    assert len(pairs) == 4
    assert pairs[1]["input_ids"].tolist() == ds[0]["negative"]["input_ids"].tolist()
    ds.filter(lambda r: "Hello 0." not in tpl.decode(r["negative"]["input_ids"]))
    assert len(ds) == 4


def test_encode_add_generation_prompt_and_user_data(tpl):
    ds = Dataset(DatasetMeta(data=[{"question": "2+2?", "answer": "#### 4"}]))
    ds.set_template(tpl).map("GSM8KProcessor", init_args={"system": ""})
    ds.encode(add_generation_prompt=True)
    feature = ds[0]
    assert tpl.decode(feature["input_ids"]) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (feature["labels"] == -100).all()
    assert feature["user_data"] == [["ground_truth", "4"]]
    plain = Dataset(DatasetMeta(data=[{"question": "2+2?", "answer": "#### 4"}]))
    plain.set_template(tpl).map("GSM8KProcessor", init_args={"system": ""}).encode()
    assert len(plain[0]["input_ids"]) < len(feature["input_ids"])


class Counting(Preprocessor):
    def __init__(self):
        self.calls = 0

    def process(self, row):
        self.calls += 1
        return {"messages": row["messages"]}


def test_lazy_dataset_works_on_read_and_matches_eager(tpl):
    counting = Counting()
    lazy = LazyDataset(DatasetMeta(data=COUNT)).set_template(tpl).map(counting).encode()
    assert counting.calls == 0 and len(lazy) == 8
    third = lazy[2]
    assert counting.calls == 1
    eager = Dataset(DatasetMeta(data=COUNT)).set_template(tpl).map(Counting()).encode()
    assert third["input_ids"].tolist() == eager[2]["input_ids"].tolist()
    assert [f["labels"].tolist() for f in lazy] == [f["labels"].tolist() for f in eager]
    lazy.filter(lambda f: f["length"] > 25)
    assert [f["length"] for f in lazy] == [f["length"] for f in eager if f["length"] > 25]
    with pytest.raises(RuntimeError, match="already encoded"):
        lazy.map(counting)


def test_lazy_dataset_keeps_images_as_given(vl_template):
    from twinkle.dataset._self_cognition_vl import draw

    picture = draw("square", "green")
    seen = []

    class OCR(Preprocessor):
        def __call__(self, rows):
            rows = self.map_col_to_row(rows)
            out = [self.preprocess(r) for r in rows]
            return self.map_row_to_col(out)

        def preprocess(self, row):
            seen.append(type(row["image"]).__name__)
            return Trajectory(
                messages=[
                    Message(role="user", content="<image>What?", images=[row["image"]]),
                    Message(role="assistant", content=row["text"]),
                ]
            )

    rows = [{"image": picture, "text": "a square"}]
    lazy = LazyDataset(DatasetMeta(data=[{"i": 0}]))
    lazy._data = lazy._data.map(lambda r: rows[0], remove_columns=["i"]).cast_column(
        "image", __import__("datasets").Image()
    )
    lazy.set_template(vl_template).map(OCR()).encode(batched=True)
    feature = lazy[0]
    assert seen == ["PngImageFile"] or seen[0].endswith("ImageFile")
    assert feature["image_grid_thw"].tolist()[0][0] == 1
    assert feature["pixel_values"].shape[0] == int(np.prod(feature["image_grid_thw"], -1).sum())


@pytest.fixture(scope="module")
def vl_template():
    return Qwen3_5Template(model_id="tiny://qwen3.5-vl", max_length=512)


def test_lazy_dataset_cannot_drop_at_read_time(tokenizer):
    tpl = Qwen3_5Template(tokenizer=tokenizer, max_length=8, truncation_strategy="delete")
    lazy = LazyDataset(DatasetMeta(data=COUNT)).set_template(tpl).encode()
    with pytest.raises(ValueError, match="row 0: longer than max_length=8"):
        lazy[0]
    dropping = LazyDataset(DatasetMeta(data=COUNT)).map(lambda row: None)
    with pytest.raises(ValueError, match="made 0 rows"):
        dropping[0]


def test_packing_dataset(tpl):
    plain = Dataset(DatasetMeta(data=COUNT)).set_template(tpl).encode()
    packed = PackingDataset(DatasetMeta(data=COUNT), packing_num_proc=2).set_template(tpl)
    assert len(packed) == 8  # rows before encode
    packed.encode()
    lengths = [f["length"] for f in plain]
    assert len(packed) == len(pack_lengths(lengths, 64)) < 8
    rows = list(packed)
    assert all(r["length"] <= 64 for r in rows)
    assert sum(r["length"] for r in rows) == sum(lengths)
    # Every sample appears exactly once, its tokens contiguous, positions restarting.
    groups = pack_lengths(lengths, 64)
    for row, group in zip(rows, groups):
        expected = np.concatenate([plain[i]["input_ids"] for i in group])
        np.testing.assert_array_equal(row["input_ids"], expected)
        starts = np.flatnonzero(row["position_ids"] == 0).tolist()
        assert starts == np.cumsum([0] + [lengths[i] for i in group[:-1]]).tolist()
    assert sorted(i for g in groups for i in g) == list(range(8))
    packed.filter(lambda f: f["length"] < max(lengths))
    assert sum(r["length"] for r in packed) == sum(lengths) - max(lengths)
    no_limit = PackingDataset(DatasetMeta(data=COUNT)).set_template(
        Qwen3_5Template(tokenizer=tpl.tokenizer)
    )
    with pytest.raises(RuntimeError, match="call encode"):
        no_limit.pack_dataset()
    with pytest.raises(RuntimeError, match="max_length"):
        no_limit.encode().pack_dataset()


def test_iterable_dataset_streams(tokenizer):
    tpl = Qwen3_5Template(tokenizer=tokenizer, max_length=30, truncation_strategy="delete")
    eager = Dataset(DatasetMeta(data=COUNT)).set_template(tpl).encode()
    stream = IterableDataset(DatasetMeta(data=COUNT)).set_template(tpl)
    stream.map(lambda row: row if "Count to 2." != row["messages"][0]["content"] else None)
    stream.encode()
    assert not hasattr(stream, "__len__")
    got = [f["input_ids"].tolist() for f in stream]
    want = [
        f["input_ids"].tolist() for f in eager if "Count to 2" not in tpl.decode(f["input_ids"])
    ]
    assert got == want and len(got) < 7  # the map's drop and truncation's deletes
    loader = DataLoader(stream, batch_size=2)
    batches = list(loader)
    assert [len(b) for b in batches] == [2] * (len(got) // 2) + [1] * (len(got) % 2)
    with pytest.raises(TypeError, match="no len"):
        len(loader)
    loader.resume_from_checkpoint(3)
    resumed = [f["input_ids"].tolist() for b in loader for f in b]
    assert resumed == got[3:]
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(stream, batch_size=2, shuffle=True)


def test_iterable_filter_before_and_after_encode(tpl):
    stream = IterableDataset(DatasetMeta(data=COUNT)).set_template(tpl)
    stream.filter(lambda row: row["messages"][0]["content"] != "Count to 1.")
    stream.encode().filter(lambda f: isinstance(f, InputFeature) and f["length"] < 30)
    lengths = [f["length"] for f in stream]
    assert lengths and all(n < 30 for n in lengths)
    assert len(lengths) < 7


def test_iterable_packing(tpl):
    eager = Dataset(DatasetMeta(data=COUNT)).set_template(tpl).encode()
    total = sum(f["length"] for f in eager)
    packing = IterablePackingDataset(DatasetMeta(data=COUNT), packing_interval=3)
    packing.set_template(tpl).encode()
    packing.pack_dataset()
    rows = list(packing)
    assert all(r["length"] <= 64 for r in rows) and sum(r["length"] for r in rows) == total
    assert len(rows) < 8
    cyclic = IterablePackingDataset(DatasetMeta(data=COUNT), packing_interval=4, cyclic=True)
    cyclic.set_template(tpl).encode()
    first = [r for _, r in zip(range(12), cyclic)]
    assert len(first) == 12 and sum(r["length"] for r in first) > total
    with pytest.raises(RuntimeError, match="call encode"):
        list(IterablePackingDataset(DatasetMeta(data=COUNT)).set_template(tpl))


def test_dataloader_accepts_num_workers():
    loader = DataLoader(dataset=list(range(5)), batch_size=2, num_workers=0)
    assert list(loader) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(dataset=[1], batch_size=1, num_workers=-1)
