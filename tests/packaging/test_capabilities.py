"""Each backend answers "can it ..." by its declared Capabilities, not by its type or methods."""

from __future__ import annotations

import pytest

from twinkle.model.protocol import capabilities_of

pytestmark = pytest.mark.unit


def _adapter_capabilities(cls) -> tuple[bool, bool, bool]:
    caps = capabilities_of(object.__new__(cls))  # what the server reads off a built model
    return caps.adapter_paging, caps.adapter_state_io, caps.local_tenants


def test_each_backend_declares_paging_adapter_state_and_local_tenants():
    from twinkle.model import MockModel, MultiLoraMegatronModel, MultiLoraTransformersModel
    from twinkle.model.megatron.parallel import ParallelMegatronModel
    from twinkle.parallel import DataParallelModel

    # (paging, adapter state in memory, tenants in this process)
    assert _adapter_capabilities(MultiLoraTransformersModel) == (True, True, True)
    assert _adapter_capabilities(MultiLoraMegatronModel) == (False, True, True)
    assert _adapter_capabilities(ParallelMegatronModel) == (False, True, False)
    assert _adapter_capabilities(DataParallelModel) == (False, True, False)
    assert _adapter_capabilities(MockModel) == (False, False, False)


def test_what_the_probes_found_is_what_the_backends_declare():
    """The declarations agree with the methods the server used to probe for."""
    from twinkle.model import MockModel, MultiLoraMegatronModel, MultiLoraTransformersModel
    from twinkle.parallel import DataParallelModel

    for cls in (MultiLoraTransformersModel, MultiLoraMegatronModel, DataParallelModel, MockModel):
        caps = cls.capabilities
        assert caps.adapter_state_io == all(
            hasattr(cls, m) for m in ("adapter_state_dict", "load_adapter_state_dict")
        ), cls.__name__
        assert caps.local_tenants == hasattr(cls, "tenant"), cls.__name__
        assert not caps.adapter_paging or hasattr(cls, "enable_paging"), cls.__name__


def test_only_the_torch_sampler_holds_live_adapters():
    from twinkle.sampler import MockSampler, TorchSampler
    from twinkle.sampler.base import Sampler

    assert (Sampler.live_adapters, TorchSampler.live_adapters) == (False, True)
    assert MockSampler.live_adapters is False
