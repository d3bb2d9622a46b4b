"""The ``execution:`` block of model and sampler args: ExecutionOptions from one place."""

from __future__ import annotations

import logging

import pytest
from config_samples import tiny_config_data

from twinkle.model.options import ExecutionOptions
from twinkle.server.config import ConfigError, parse_config

pytestmark = pytest.mark.unit


def _model_args(data):
    return next(a for a in data["applications"] if a["import_path"] == "model")["args"]


def test_the_block_gives_the_models_options():
    data = tiny_config_data()
    _model_args(data)["execution"] = {"lora_kernel": "torch", "logprob_chunk_bytes": 4096}
    args = next(a for a in parse_config(data).applications if a.import_path == "model").args
    options = args.execution.options()
    assert isinstance(options, ExecutionOptions)
    assert options.lora_kernel == "torch" and options.logprob_chunk_bytes == 4096
    assert options.direct_weight_grads is True  # untouched fields keep the defaults


def test_old_top_level_cpu_threads_moves_into_the_block(caplog):
    data = tiny_config_data()
    _model_args(data)["cpu_threads"] = 3
    with caplog.at_level(logging.WARNING, logger="twinkle.server.config"):
        config = parse_config(data)
    args = next(a for a in config.applications if a.import_path == "model").args
    assert args.execution.cpu_threads == 3
    assert "execution.cpu_threads" in caplog.text


def test_contradicting_old_and_new_keys_are_refused():
    data = tiny_config_data()
    _model_args(data)["cpu_threads"] = 3
    _model_args(data)["execution"] = {"cpu_threads": 2}
    with pytest.raises(ConfigError, match="contradicts execution.cpu_threads"):
        parse_config(data)


def test_unknown_and_mistyped_execution_fields_are_refused():
    data = tiny_config_data()
    _model_args(data)["execution"] = {"lora_kernal": "torch"}
    with pytest.raises(ConfigError, match="execution.lora_kernal: unknown field"):
        parse_config(data)
    _model_args(data)["execution"] = {"lora_kernel": "cuda"}
    with pytest.raises(ConfigError, match="lora_kernel"):
        parse_config(data)
