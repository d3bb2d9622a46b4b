"""Row preprocessors and their registry."""

import pytest

from twinkle.preprocessor import (
    AlpacaProcessor,
    MessagesProcessor,
    MissingFieldError,
    Preprocessor,
    SelfCognitionProcessor,
    get_preprocessor,
    list_preprocessors,
)


def test_self_cognition_fills_placeholders():
    proc = SelfCognitionProcessor("Twinkle", "ModelScope")
    out = proc({"query": "Are you {{NAME}}?", "response": "I am {{NAME}} by {{AUTHOR}}."})
    assert out == {
        "messages": [
            {"role": "user", "content": "Are you Twinkle?"},
            {"role": "assistant", "content": "I am Twinkle by ModelScope."},
        ]
    }


def test_self_cognition_optional_system_prompt():
    out = SelfCognitionProcessor("A", "B", system="Be brief.")({"query": "q", "response": "r"})
    assert out["messages"][0] == {"role": "system", "content": "Be brief."}


def test_alpaca_joins_instruction_and_input():
    proc = AlpacaProcessor()
    row = {"instruction": "Translate.", "input": "hello", "output": "bonjour"}
    assert proc(row)["messages"][0]["content"] == "Translate.\n\nhello"
    row["input"] = ""
    assert proc(row)["messages"] == [
        {"role": "user", "content": "Translate."},
        {"role": "assistant", "content": "bonjour"},
    ]


def test_messages_processor_keeps_extra_and_checks_fields():
    row = {"messages": [{"role": "user", "content": "hi", "name": "x"}], "extra": {"answer": 1}}
    out = MessagesProcessor()(row)
    assert out["messages"] == [{"role": "user", "content": "hi", "reasoning_content": None}]
    assert out["extra"] == {"answer": 1}
    with pytest.raises(MissingFieldError, match=r"'content' in messages\[0\]"):
        MessagesProcessor()({"messages": [{"role": "user"}]})


def test_missing_field_names_the_field():
    with pytest.raises(MissingFieldError) as info:
        SelfCognitionProcessor("A", "B")({"query": "q"})
    assert info.value.field == "response"
    assert isinstance(info.value, ValueError)


def test_registry():
    assert {"AlpacaProcessor", "MessagesProcessor", "SelfCognitionProcessor"} <= set(
        list_preprocessors()
    )
    built = get_preprocessor("SelfCognitionProcessor", {"model_name": "A", "model_author": "B"})
    assert isinstance(built, SelfCognitionProcessor) and built.model_author == "B"
    assert isinstance(get_preprocessor(AlpacaProcessor), AlpacaProcessor)
    with pytest.raises(ValueError, match="SelfCognitionProcessor"):
        get_preprocessor("NoSuchProcessor")
    with pytest.raises(TypeError, match="init_args"):
        get_preprocessor(AlpacaProcessor(), {"system": "x"})
    with pytest.raises(TypeError):
        get_preprocessor(42)


def test_base_process_is_abstract():
    with pytest.raises(NotImplementedError):
        Preprocessor()({})
