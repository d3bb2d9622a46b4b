"""Test-wide settings: nothing may reach a model hub, and Ray/Tinker stay quiet and local."""

import os
import shutil

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "TINKER_TELEMETRY": "0",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

# Every Ray a test uses is one it starts: `ray.init()` and `twinkle-server launch` would otherwise
# join any cluster `ray start` left running on the machine (another user's, another run's). Tests
# that start a cluster of their own pass its address explicitly.
os.environ["RAY_ADDRESS"] = "local"

# Triton's interpreter must be chosen before anything imports triton (torch and transformers do,
# and triton's own library functions are built at import): without a GPU, the kernel tests run
# interpreted on the CPU.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu`` tests cleanly on machines without CUDA."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
