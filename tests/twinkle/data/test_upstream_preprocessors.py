"""Upstream Twinkle's preprocessors and preprocessor styles, run by our ``Dataset.map``."""

from __future__ import annotations

import pytest

from twinkle.data_format import Message, Trajectory
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.preprocessor import (
    CompetitionMathGRPOProcessor,
    CompetitionMathProcessor,
    CountdownProcessor,
    DataFilter,
    EmojiDPOProcessor,
    Filter,
    GSM8KProcessor,
    Mapper,
    Preprocessor,
    get_preprocessor,
)
from twinkle.preprocessor.llm import GSM8KProcessor as GSM8KFromLlm
from twinkle.preprocessor.llm import boxed_answer, gsm8k_answer

GSM8K = [
    {
        "question": "Tom has 3 apples and buys 1,000 more. How many?",
        "answer": "3+1000=1003\n#### 1,003",
    },
    {"question": "What is 2 + 2?", "answer": "#### 4"},
]


def test_column_row_helpers():
    columns = {"a": [1, 2], "b": ["x", "y"]}
    rows = Preprocessor.map_col_to_row(columns)
    assert rows == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert Preprocessor.map_row_to_col(rows) == columns
    assert Preprocessor.map_col_to_row(rows) is rows  # a list passes through
    assert Preprocessor.map_row_to_col([{"a": 1}, {"b": 2}], keys=["c"]) == {
        "c": [None, None],
        "a": [1, None],
        "b": [None, 2],
    }
    assert Preprocessor.map_col_to_row({}) == []
    with pytest.raises(ValueError, match="different lengths"):
        Preprocessor.map_col_to_row({"a": [1, 2], "b": [1]})


def test_gsm8k_is_a_prompt_with_the_ground_truth():
    assert GSM8KFromLlm is GSM8KProcessor
    out = GSM8KProcessor(system="Be exact.")(GSM8K[0])
    assert [m.role for m in out.messages] == ["system", "user"]
    assert (
        out.messages[0].content == "Be exact." and out.messages[1].content == GSM8K[0]["question"]
    )
    assert out.user_data == [("ground_truth", "1003")]
    with_answer = GSM8KProcessor(add_assistant=True)(GSM8K[1])
    assert with_answer.messages[-1] == Message(role="assistant", content="#### 4")
    assert "\\boxed" in GSM8KProcessor()(GSM8K[1]).messages[0].content
    assert gsm8k_answer("no marker") == ""


def test_countdown_and_competition_math():
    out = CountdownProcessor()({"nums": [3, 5, 7], "target": 22})
    assert out.user_data == [{"target": 22, "nums": [3, 5, 7]}]
    assert "[3, 5, 7]" in out.messages[-1].content and "22" in out.messages[-1].content
    assert "<answer>" in out.messages[-1].content
    assert CountdownProcessor()({"nums": [1], "response": 9}).user_data[0]["target"] == 9
    row = {"problem": "Compute 1/2 + 1/2.", "solution": "It is $\\boxed{1}$."}
    sft = CompetitionMathProcessor()(row)
    assert [(m.role, m.content) for m in sft.messages] == [
        ("user", row["problem"]),
        ("assistant", row["solution"]),
    ]
    grpo = CompetitionMathGRPOProcessor()(row)
    assert [m.role for m in grpo.messages] == ["system", "user"]
    assert grpo.user_data == [("solution", row["solution"]), ("ground_truth", "1")]
    assert boxed_answer("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    assert boxed_answer("none") is None


def test_emoji_dpo_rows():
    row = {"prompt": "Hi!", "answer_zh": "你好 😊", "answer_en": "Hello."}
    out = EmojiDPOProcessor(system="Be kind.")(row)
    assert set(out) == {"positive", "negative"}
    assert [m.content for m in out["positive"].messages] == ["Be kind.", "Hi!", "你好 😊"]
    assert [m.content for m in out["negative"].messages] == ["Be kind.", "Hi!", "Hello."]
    with pytest.raises(ValueError, match="answer_en"):
        EmojiDPOProcessor()({"prompt": "Hi!", "answer_zh": "x"})


class LatexOCRStyle(Preprocessor):
    """Upstream's batch style: columns in, columns out."""

    def __call__(self, rows):
        rows = self.map_col_to_row(rows)
        rows = [self.preprocess(row) for row in rows]
        return self.map_row_to_col(rows)

    def preprocess(self, row):
        return Trajectory(
            messages=[
                Message(role="user", content=f"Say {row['text']}"),
                Message(role="assistant", content=row["text"]),
            ]
        )


class RowStyle(Preprocessor):
    """Upstream's row style: ``__call__(row) -> Trajectory``, empty messages mark a drop."""

    def __call__(self, row):
        if row["level"] != "hard":
            return Trajectory(messages=[], user_data=[])
        return Trajectory(
            messages=[Message(role="user", content=row["text"])],
            user_data=[("ground_truth", row["text"].upper()), ("flag", True)],
        )


ROWS = [{"text": t, "level": lv} for t, lv in [("a", "easy"), ("b", "hard"), ("c", "hard")]]


def test_batch_style_preprocessor_runs_in_map():
    ds = Dataset(DatasetMeta(data=ROWS)).map(LatexOCRStyle())
    assert len(ds) == 3
    assert [m["content"] for m in ds[1]["messages"]] == ["Say b", "b"]


def test_row_style_preprocessor_with_user_data_and_filter():
    ds = Dataset(DatasetMeta(data=ROWS)).map(RowStyle())
    assert ds[0]["messages"] == [] and len(ds) == 3
    ds.filter(lambda row: bool(row["messages"]))
    assert len(ds) == 2
    # Mixed-type pairs survive the table (stored as JSON text, read back as lists).
    assert ds[0]["user_data"] == [["ground_truth", "B"], ["flag", True]]


class UpperMapper(Mapper):
    def map(self, row):
        return {**row, "text": row["text"].upper()}


class HardOnly(Filter):
    def keep(self, row):
        return row["level"] == "hard"


class NotC(DataFilter):
    def __call__(self, row):
        return row["text"] != "C"


def test_mapper_filter_and_datafilter():
    assert HardOnly()(ROWS) == (ROWS[1:], [{**ROWS[0], "drop_reason": "HardOnly"}])
    assert UpperMapper()({"text": ["a"], "level": ["x"]}) == ([{"text": "A", "level": "x"}], [])
    ds = Dataset(DatasetMeta(data=ROWS)).map(HardOnly()).map(UpperMapper())
    assert [r["text"] for r in ds] == ["B", "C"]
    ds.filter(NotC)
    assert [r["text"] for r in ds] == ["B"]
    assert [r["text"] for r in Dataset(DatasetMeta(data=ROWS)).filter(HardOnly())] == ["b", "c"]
    assert isinstance(get_preprocessor("GSM8KProcessor"), GSM8KProcessor)


def test_named_preprocessors_run_in_map():
    ds = Dataset(DatasetMeta(data=GSM8K)).map("GSM8KProcessor", init_args={"system": "S"})
    assert ds[0]["user_data"] == [["ground_truth", "1003"]]
    assert ds[1]["messages"][0] == {"role": "system", "content": "S"}


def test_a_preprocessor_returning_something_else_names_the_row():
    with pytest.raises(ValueError, match="row 0: .*got int"):
        Dataset(DatasetMeta(data=ROWS)).map(lambda row: 3)
