"""The ``mock`` backend's builder (:mod:`twinkle.model.factory`)."""

from __future__ import annotations

from typing import Any

from twinkle.model.factory import refuse_data_parallel, register_backend
from twinkle.model.mock._model import MockModel


@register_backend("mock")
def build_mock(model_id: str, dp_size: int = 1, **_options: Any) -> MockModel:
    """A :class:`MockModel` with the vocabulary of ``model_id``'s tokenizer, so that real
    tokenized data fits it. The mock has no device, threads or passes: the execution options
    do not apply to it.

    Raises:
        InvalidArgumentError: ``dp_size`` above 1 (the mock runs in one process).
    """
    refuse_data_parallel("mock", dp_size)
    return MockModel.for_model(model_id)
