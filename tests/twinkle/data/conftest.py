"""Shared fixtures for the data pipeline tests: the offline tiny tokenizer and templates."""

import pytest

TINY = "tiny://qwen3.5"


@pytest.fixture(scope="session")
def tokenizer():
    from twinkle.hub import load_tokenizer

    return load_tokenizer(TINY)


@pytest.fixture
def template(tokenizer):
    from twinkle.template import Qwen3_5Template

    return Qwen3_5Template(tokenizer=tokenizer)


@pytest.fixture
def make_template(tokenizer):
    """Build a template of any class around the session tokenizer."""
    from twinkle.template import Template

    def make(cls=Template, **kwargs):
        return cls(tokenizer=tokenizer, **kwargs)

    return make
