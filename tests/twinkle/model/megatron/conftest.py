"""Fixtures of the megatron backend tests; each test module skips itself without megatron-core."""

import pytest


@pytest.fixture(scope="package")
def mmodel():
    """One megatron model for the directory (building it is the slow part); tests add and
    remove their own tenants."""
    from twinkle.model.megatron import MultiLoraMegatronModel

    return MultiLoraMegatronModel("tiny://qwen3")


@pytest.fixture
def model(mmodel):
    yield mmodel
    for name in list(mmodel.tenants):
        mmodel.remove_adapter(name)


@pytest.fixture(scope="package")
def hf_model():
    from transformers import AutoModelForCausalLM

    from twinkle.hub import resolve_model_dir

    return AutoModelForCausalLM.from_pretrained(resolve_model_dir("tiny://qwen3")).eval()


def pytest_collection_modifyitems(config, items):
    # megatron-core 0.16 warns on every linear forward (the backend filters it; pytest resets filters).
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.filterwarnings("ignore:Warning. tp_group is None"))


@pytest.fixture(scope="module")
def local_ray():
    """A light local Ray (ENVIRONMENT.md's settings) for the tests of the Ray rank launcher."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # another module's Ray: reuse it, leave it running
        yield ray
        return
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
