"""The model factory: backends found by name in a registry (``twinkle.model.factory``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from twinkle.errors import InvalidArgumentError
from twinkle.model import factory


def test_the_built_in_backends_are_registered_by_name():
    assert {"transformers", "megatron", "mock"} <= set(factory.registered_backends())


def test_an_unknown_backend_names_the_registered_ones():
    with pytest.raises(InvalidArgumentError) as info:
        factory.create_model("jax", "tiny://qwen3")
    message = str(info.value)
    assert "unknown backend 'jax'" in message
    for name in ("megatron", "mock", "transformers"):
        assert name in message


def test_a_registered_backend_is_built_with_the_given_arguments(monkeypatch):
    monkeypatch.setattr(factory, "_BUILDERS", dict(factory._BUILDERS))
    built = {}

    @factory.register_backend("echo")
    def build(model_id, **kwargs):
        built.update(kwargs, model_id=model_id)
        return "model"

    assert factory.create_model("echo", "m", dp_size=3) == "model"
    assert built == {"model_id": "m", "dp_size": 3}
    assert "echo" in factory.registered_backends()
    with pytest.raises(InvalidArgumentError, match="registered already"):
        factory.register_backend("echo")(lambda model_id: None)


def test_building_the_mock_imports_no_torch():
    code = (
        "import sys\n"
        "from twinkle.model.factory import create_model\n"
        "model = create_model('mock', 'mock')\n"
        "print(type(model).__name__, model.vocab_size, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["MockModel", "256", "False"]


def test_the_mock_refuses_data_parallel_replicas():
    with pytest.raises(InvalidArgumentError, match="dp_size 2 > 1 needs backend 'transformers'"):
        factory.create_model("mock", "mock", dp_size=2)
