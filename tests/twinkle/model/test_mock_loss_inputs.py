"""The numpy mock backend: ``forward_only(disable_lora=True)`` is the base model, its result has
``.result``, and inputs it cannot honour (references, teachers, embeddings) are refused."""

import numpy as np
import pytest

from twinkle.errors import InvalidArgumentError
from twinkle.model.mock import MockModel

ROWS = [{"input_ids": [1, 2, 3, 4, 5], "labels": [-100, -100, 3, 4, 5]}]


def test_mock_disable_lora_is_the_base_model():
    m = MockModel()
    m.add_adapter_to_model("a", {"r": 4, "lora_alpha": 8})
    m.set_optimizer("Adam", lr=0.1)
    base = m.forward_only(ROWS, disable_lora=True)
    assert base.result is base and set(base) == {"logprobs", "num_tokens"}
    for _ in range(3):
        m.forward_backward(ROWS)
        m.clip_grad_and_step()
    adapted = m.forward_only(ROWS)
    np.testing.assert_allclose(
        m.forward_only(ROWS, disable_lora=True)["logprobs"][0], base["logprobs"][0]
    )
    assert np.abs(adapted.result["logprobs"][0] - base["logprobs"][0]).max() > 1e-3


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"task": "embedding"}, "task='embedding'"),
        ({"ref_outputs": {"logprobs": [[0.0]]}}, "ref_outputs"),
        ({"disable_lora": True}, "disable_lora"),
    ],
)
def test_mock_refuses_what_it_cannot_honour(kwargs, named):
    m = MockModel()
    m.add_adapter_to_model("a", {"r": 4, "lora_alpha": 8})
    with pytest.raises(InvalidArgumentError, match=named):
        m.forward_backward(ROWS, **kwargs)
    assert not m._resolve("a").pending_grads
