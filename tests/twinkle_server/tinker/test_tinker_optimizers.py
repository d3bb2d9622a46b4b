"""The SDK's optimizer families: AdamParams reaches the model field by field; Dimuon (which the
SDK does not define precisely) is a 400 naming it, at creation and at optim_step."""

from __future__ import annotations

import pytest
import tinker
from tinker import types

from tests.twinkle_server.tinker.test_tinker_sdk import BASE_MODEL, DATA
from twinkle.server.tinker.optimizers import check_optim_params
from twinkle.server.web.errors import BadRequest

pytestmark = pytest.mark.integration

ADAM = types.AdamParams(
    learning_rate=3e-3, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.5
)


def test_every_adam_params_field_reaches_the_model():
    body = types.OptimStepRequest(optim_params=ADAM, model_id="m", seq_id=1).model_dump()
    assert "adam_params" in body
    assert check_optim_params(body) == ADAM.model_dump()


def test_dimuon_params_are_refused_naming_them():
    body = types.OptimStepRequest(
        optim_params=types.DimuonParams(learning_rate=1e-3), model_id="m", seq_id=1
    ).model_dump()
    assert "optimizer_params" in body
    with pytest.raises(BadRequest, match="DimuonParams"):
        check_optim_params(body)


def test_dimuon_through_the_sdk_is_a_400(service):
    with pytest.raises(tinker.BadRequestError, match="dimuon"):
        service.create_lora_training_client(
            base_model=BASE_MODEL, rank=2, optimizer=types.DimuonOptimizerConfig()
        ).result(timeout=60)
    client = service.create_lora_training_client(base_model=BASE_MODEL, rank=2).result(timeout=60)
    client.forward_backward(DATA, "cross_entropy").result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="DimuonParams"):
        client.optim_step(types.DimuonParams(learning_rate=1e-3)).result(timeout=60)
    metrics = client.optim_step(ADAM).result(timeout=60).metrics
    assert metrics["learning_rate:mean"] == pytest.approx(ADAM.learning_rate)
    assert metrics["grad_norm:mean"] > 0
