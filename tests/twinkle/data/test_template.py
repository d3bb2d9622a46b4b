"""Template rendering (exact strings), label masking and truncation."""

import numpy as np
import pytest

from twinkle.data_format import Message, Trajectory
from twinkle.template import (
    Qwen3_5Template,
    Qwen3Template,
    Template,
    get_template,
    list_templates,
)

SYSTEM = Message(role="system", content="You are a helpful assistant")
USER = Message(role="user", content="你是谁？")
ANSWER = Message(role="assistant", content="I am Twinkle.")


def labelled_text(template, feature):
    """Decode the tokens that carry a loss, keeping gaps between labelled spans visible."""
    labels = feature["labels"]
    spans, current = [], []
    for label in labels.tolist():
        if label == -100:
            if current:
                spans.append(current)
            current = []
        else:
            current.append(label)
    if current:
        spans.append(current)
    return [template.decode(span) for span in spans]


def test_single_turn(template):
    traj = Trajectory(messages=[USER, ANSWER])
    expected = (
        "<|im_start|>user\n你是谁？<|im_end|>\n<|im_start|>assistant\nI am Twinkle.<|im_end|>\n"
    )
    assert template.render(traj) == expected
    feature = template.encode(traj)
    assert template.decode(feature["input_ids"]) == expected
    assert labelled_text(template, feature) == ["I am Twinkle.<|im_end|>"]
    assert feature["length"] == len(feature["input_ids"])


def test_system_prompt_is_not_trained(template):
    traj = Trajectory(messages=[SYSTEM, USER, ANSWER])
    assert template.render(traj) == (
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
        "<|im_start|>user\n你是谁？<|im_end|>\n"
        "<|im_start|>assistant\nI am Twinkle.<|im_end|>\n"
    )
    assert labelled_text(template, template.encode(traj)) == ["I am Twinkle.<|im_end|>"]


def test_multi_turn_trains_every_assistant_turn(template):
    traj = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
        ]
    }
    assert template.render(traj) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    )
    feature = template.encode(traj)
    assert labelled_text(template, feature) == ["Hello!<|im_end|>", "4<|im_end|>"]
    trained = feature["labels"] != -100
    np.testing.assert_array_equal(feature["labels"][trained], feature["input_ids"][trained])


def test_generation_prompt(template):
    traj = Trajectory(messages=[SYSTEM, USER])
    expected = (
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
        "<|im_start|>user\n你是谁？<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render(traj, add_generation_prompt=True) == expected
    feature = template.batch_encode([traj], add_generation_prompt=True)[0]
    assert template.decode(feature["input_ids"].tolist()) == expected
    assert (feature["labels"] == -100).all()


def test_reasoning_content_renders_a_think_block(template):
    answer = Message(role="assistant", content="4", reasoning_content="2 plus 2 is 4.")
    traj = Trajectory(messages=[Message(role="user", content="2+2?"), answer])
    body = "<think>\n2 plus 2 is 4.\n</think>\n\n4<|im_end|>"
    assert (
        template.render(traj)
        == f"<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n{body}\n"
    )
    assert labelled_text(template, template.encode(traj)) == [body]


def test_qwen3_without_thinking_primes_an_empty_think_block(make_template):
    template = make_template(Qwen3Template, enable_thinking=False)
    text = template.render(Trajectory(messages=[USER]), add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_special_token_ids(template, tokenizer):
    assert template.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert template.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert template.decode([template.eos_token_id]) == "<|im_end|>"
    assert template.decode([template.eos_token_id], skip_special_tokens=True) == ""


def test_registry_builds_by_name_and_rejects_unknown_names():
    assert {"Template", "Qwen3Template", "Qwen3_5Template"} <= set(list_templates())
    built = get_template("Qwen3_5Template", max_length=64)
    assert isinstance(built, Qwen3_5Template) and built.max_length == 64
    with pytest.raises(ValueError, match="Qwen3_5Template"):
        get_template("Llama9Template")


def test_template_without_model_id_explains_itself():
    template = Template()
    with pytest.raises(RuntimeError, match="model_id"):
        template.encode({"messages": [{"role": "user", "content": "hi"}]})


def test_setting_model_id_later_loads_its_tokenizer():
    template = Template()
    template.model_id = "tiny://qwen3.5"
    assert template.render({"messages": [{"role": "user", "content": "x"}]}).startswith(
        "<|im_start|>user"
    )
    assert template.encode({"messages": [{"role": "user", "content": "x"}]})["length"] > 0


def test_unknown_truncation_strategy():
    with pytest.raises(ValueError, match="truncation_strategy"):
        Template(truncation_strategy="middle")
    with pytest.raises(ValueError, match="max_length"):
        Template(max_length=0)


LONG = Trajectory(messages=[USER, Message(role="assistant", content="one two three four " * 8)])


@pytest.fixture
def full(template):
    return template.encode(LONG)


def test_truncation_raise_names_length_and_limit(make_template, full):
    template = make_template(max_length=10)
    with pytest.raises(ValueError, match=rf"{full['length']} tokens.*max_length=10"):
        template.encode(LONG)


def test_truncation_left_keeps_last_tokens(make_template, full):
    feature = make_template(max_length=10, truncation_strategy="left").encode(LONG)
    assert feature["input_ids"].tolist() == full["input_ids"][-10:].tolist()
    assert feature["labels"].tolist() == full["labels"][-10:].tolist()
    assert feature["length"] == 10


def test_truncation_right_keeps_first_tokens(make_template, full):
    feature = make_template(max_length=10, truncation_strategy="right").encode(LONG)
    assert feature["input_ids"].tolist() == full["input_ids"][:10].tolist()
    assert feature["labels"].tolist() == full["labels"][:10].tolist()


def test_truncation_delete_returns_none(make_template, full):
    template = make_template(max_length=full["length"], truncation_strategy="delete")
    short = {"messages": [{"role": "user", "content": "hi"}]}
    assert template.encode(LONG) is not None  # exactly at the limit is kept
    template.max_length = full["length"] - 1
    assert template.encode(LONG) is None
    out = template.batch_encode([LONG, short])
    assert out[0] is None and out[1] is not None
