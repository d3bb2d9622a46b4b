"""Dataset: loading, slicing, map, filter, encode, errors."""

import json
import logging

import numpy as np
import pytest

from twinkle.data_format import InputFeature, Trajectory
from twinkle.dataset import BUILTIN_DATASETS, Dataset, DatasetMeta
from twinkle.preprocessor import AlpacaProcessor, SelfCognitionProcessor
from twinkle.template import Qwen3_5Template

TINY = "tiny://qwen3.5"
ROWS = [{"query": f"question {i}?", "response": f"answer {i} by {{{{NAME}}}}."} for i in range(10)]
IDENTITY = {"model_name": "Twinkle", "model_author": "ModelScope"}


def memory(rows=ROWS, **kwargs):
    return Dataset(dataset_meta=DatasetMeta(data=rows, **kwargs))


def test_builtin_self_cognition_ships_with_the_package():
    path = BUILTIN_DATASETS["self-cognition"]
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert 120 <= len(rows) <= 200
    assert all(row["query"] and row["response"] for row in rows)
    assert sum("{{NAME}}" in row["response"] for row in rows) >= 60
    assert any("{{AUTHOR}}" in row["response"] for row in rows)
    assert any("你" in row["query"] for row in rows)


def test_builtin_pipeline_end_to_end():
    ds = Dataset(dataset_meta=DatasetMeta("builtin://self-cognition", data_slice=range(500)))
    assert len(ds) == len(BUILTIN_DATASETS["self-cognition"].read_text().splitlines())
    ds.set_template("Qwen3_5Template", model_id=TINY, max_length=512)
    ds.map(
        "SelfCognitionProcessor", init_args={"model_name": "twinkle模型", "model_author": "社区"}
    )
    assert ds[0]["messages"][1]["content"].startswith(
        "I am twinkle模型, an AI assistant built by 社区"
    )
    ds.encode(batched=True)
    feature = ds[0]
    assert isinstance(feature, InputFeature)
    assert feature["input_ids"].dtype == np.int64
    text = ds.template.decode(feature["input_ids"])
    assert text.startswith("<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\nI am")
    assert "{{" not in text
    assert ds.column_names == ["input_ids", "labels", "length"]


def test_data_slice_forms():
    assert [r["query"] for r in memory(data_slice=range(2, 5))] == [
        f"question {i}?" for i in (2, 3, 4)
    ]
    assert [r["query"] for r in memory(data_slice=slice(None, None, 4))] == [
        "question 0?",
        "question 4?",
        "question 8?",
    ]
    assert [r["query"] for r in memory(data_slice=[7, 1])] == ["question 7?", "question 1?"]
    assert len(memory(data_slice=range(500))) == 10  # past-the-end indices are ignored
    with pytest.raises(ValueError):
        DatasetMeta(data=ROWS, data_slice=[-1])
    with pytest.raises(TypeError):
        DatasetMeta(data=ROWS, data_slice="0:3")
    with pytest.raises(ValueError, match="exactly one"):
        DatasetMeta()


@pytest.mark.parametrize(
    "how",
    ["name", "class", "instance", "callable"],
)
def test_map_accepts_name_class_instance_callable(how):
    def fn(row):
        return SelfCognitionProcessor(**IDENTITY)(row)

    args = {
        "name": ("SelfCognitionProcessor", IDENTITY),
        "class": (SelfCognitionProcessor, IDENTITY),
        "instance": (SelfCognitionProcessor(**IDENTITY), None),
        "callable": (fn, None),
    }[how]
    ds = memory().map(args[0], init_args=args[1])
    assert ds.column_names == ["messages"]
    assert ds[3]["messages"][1]["content"] == "answer 3 by Twinkle."


def test_map_drops_none_and_accepts_trajectories():
    def keep_even(row):
        i = int(row["query"].split()[1].rstrip("?"))
        if i % 2:
            return None
        return Trajectory.coerce(
            {"messages": [{"role": "user", "content": row["query"]}], "extra": {"i": i}}
        )

    ds = memory().map(keep_even)
    assert len(ds) == 5
    assert ds[1]["extra"] == {"i": 2}


def test_filter_before_and_after_encode(tokenizer):
    rows = [{"query": f"q{i}", "response": "word " * i} for i in range(1, 11)]
    ds = memory(rows).map("SelfCognitionProcessor", init_args=IDENTITY)
    ds.filter(lambda row: row["messages"][0]["content"] != "q1")
    assert len(ds) == 9
    ds.set_template(Qwen3_5Template(tokenizer=tokenizer)).encode()
    lengths = [ds[i]["length"] for i in range(len(ds))]
    seen = []
    ds.filter(lambda feature: seen.append(type(feature)) or feature["length"] < max(lengths))
    assert len(ds) == 8
    assert set(seen) == {InputFeature}
    assert [f["length"] for f in ds] == lengths[:-1]


def test_local_files_and_directories(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS[:3]))
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS[3:5]))
    csv = tmp_path / "rows.csv"
    csv.write_text("instruction,input,output\nSay hi,,hi\nAdd,1 2,3\n")
    assert len(Dataset(dataset_meta=DatasetMeta(str(tmp_path / "a.jsonl")))) == 3
    both = tmp_path / "both"
    both.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (both / name).write_text((tmp_path / name).read_text())
    assert len(Dataset(DatasetMeta(str(both)))) == 5
    alpaca = Dataset(DatasetMeta(str(csv))).map(AlpacaProcessor)
    assert alpaca[1]["messages"][0]["content"] == "Add\n\n1 2"


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        Dataset(dataset_meta=DatasetMeta(str(missing)))


@pytest.mark.parametrize(
    "dataset_id", ["ms://nobody/no-such-dataset", "hf://nobody/no-such-dataset"]
)
def test_uncached_hub_dataset_offline_fails_fast(dataset_id):
    with pytest.raises(FileNotFoundError, match="nobody/no-such-dataset"):
        Dataset(dataset_meta=DatasetMeta(dataset_id))


def test_unknown_builtin():
    with pytest.raises(ValueError, match="builtin://self-cognition"):
        Dataset(DatasetMeta("builtin://nope"))


def test_unknown_names():
    ds = memory()
    with pytest.raises(ValueError, match="Qwen3_5Template"):
        ds.set_template("NoSuchTemplate")
    with pytest.raises(ValueError, match="SelfCognitionProcessor"):
        ds.map("NoSuchProcessor")
    with pytest.raises(ValueError, match="truncation_strategy"):
        ds.set_template("Qwen3_5Template", model_id=TINY, truncation_strategy="middle")


def test_malformed_row_names_index_and_field():
    rows = ROWS[:4] + [{"query": "no answer", "response": None}] + ROWS[5:]
    with pytest.raises(ValueError, match=r"row 4: .*'response'"):
        memory(rows).map("SelfCognitionProcessor", init_args=IDENTITY)
    # A row without the key at all (Arrow fills it with None) is reported the same way.
    with pytest.raises(ValueError, match=r"row 1: .*'query'"):
        memory([{"query": "q", "response": "r"}, {"response": "r"}]).map(
            SelfCognitionProcessor, IDENTITY
        )
    # A plain function's KeyError becomes the same ValueError.
    with pytest.raises(ValueError, match=r"row 0: missing field 'prompt'"):
        memory().map(lambda row: {"messages": [{"role": "user", "content": row["prompt"]}]})


def test_malformed_messages_at_encode(tokenizer):
    rows = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": None}]},
    ]
    ds = memory(rows).set_template(Qwen3_5Template(tokenizer=tokenizer))
    with pytest.raises(ValueError, match=r"row 1: missing field 'content' in messages\[0\]"):
        ds.encode()
    raw = memory().set_template(Qwen3_5Template(tokenizer=tokenizer))
    with pytest.raises(ValueError, match="missing field 'messages'"):
        raw.encode()


def test_encode_needs_a_template():
    with pytest.raises(RuntimeError, match="set_template"):
        memory().map("SelfCognitionProcessor", init_args=IDENTITY).encode()


def encoded(strategy, max_length):
    rows = [{"query": "q", "response": "short"}, {"query": "q", "response": "long " * 40}]
    ds = memory(rows).map("SelfCognitionProcessor", init_args=IDENTITY)
    ds.set_template(
        "Qwen3_5Template", model_id=TINY, max_length=max_length, truncation_strategy=strategy
    )
    return ds.encode(load_from_cache_file=False)


def test_over_length_raise():
    with pytest.raises(ValueError, match="max_length=20"):
        encoded("raise", 20)


@pytest.mark.parametrize("strategy", ["left", "right"])
def test_over_length_truncates(strategy):
    ds = encoded(strategy, 20)
    assert len(ds) == 2
    assert ds[1]["length"] == 20 and len(ds[1]["input_ids"]) == 20
    assert ds[0]["length"] < 20


def test_over_length_delete_drops_and_logs(caplog):
    logger = logging.getLogger("twinkle")
    logger.addHandler(caplog.handler)  # the twinkle logger does not propagate to root
    try:
        with caplog.at_level(logging.INFO, logger="twinkle"):
            ds = encoded("delete", 20)
    finally:
        logger.removeHandler(caplog.handler)
    assert len(ds) == 1
    assert "dropped 1 of 2" in caplog.text


def test_encode_with_worker_processes(tokenizer):
    ds = memory().map("SelfCognitionProcessor", init_args=IDENTITY)
    ds.set_template(Qwen3_5Template(tokenizer=tokenizer))
    single = [
        f["input_ids"].tolist()
        for f in memory()
        .map("SelfCognitionProcessor", init_args=IDENTITY)
        .set_template(Qwen3_5Template(tokenizer=tokenizer))
        .encode()
    ]
    ds.encode(num_proc=2)
    assert [f["input_ids"].tolist() for f in ds] == single


def test_cannot_map_after_encode(tokenizer):
    ds = memory().map("SelfCognitionProcessor", init_args=IDENTITY)
    ds.set_template(Qwen3_5Template(tokenizer=tokenizer)).encode()
    with pytest.raises(RuntimeError, match="already encoded"):
        ds.map("SelfCognitionProcessor", init_args=IDENTITY)


def test_getitem_bounds():
    ds = memory()
    assert ds[-1]["query"] == "question 9?"
    with pytest.raises(IndexError):
        ds[10]
