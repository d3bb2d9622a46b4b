"""Every backend class offers the whole TrainingModel surface and declares its Capabilities."""

from __future__ import annotations

import pytest

from twinkle.model.protocol import Capabilities, TrainingModel

pytestmark = pytest.mark.unit

SURFACE = sorted(
    name for name in vars(TrainingModel) if not name.startswith("_") and name != "capabilities"
)


def _backends():
    from twinkle.model import MockModel, MultiLoraMegatronModel, MultiLoraTransformersModel
    from twinkle.parallel import DataParallelModel

    return [MultiLoraTransformersModel, MultiLoraMegatronModel, DataParallelModel, MockModel]


@pytest.mark.parametrize("backend", _backends(), ids=lambda cls: cls.__name__)
def test_backend_has_the_protocol_surface_and_declares_capabilities(backend):
    assert "optim_step" in SURFACE and len(SURFACE) >= 10
    missing = [name for name in SURFACE if not callable(getattr(backend, name, None))]
    assert missing == []
    assert isinstance(backend.capabilities, Capabilities)


def test_only_backends_with_a_fused_pass_declare_one():
    from twinkle.model import MockModel, MultiLoraTransformersModel
    from twinkle.parallel import DataParallelModel

    assert MultiLoraTransformersModel.capabilities == Capabilities(True, True)
    assert DataParallelModel.capabilities == Capabilities(fused_forward_backward=True)
    assert MockModel.capabilities == Capabilities()
