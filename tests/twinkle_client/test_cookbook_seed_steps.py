"""The seed's run steps on the unmodified Transformers config (issue 26, point 7).

    twinkle-server launch -c cookbook/client/server/transformer/server_config.yaml
    python cookbook/client/tinker/self_host/self_cognition.py
    python cookbook/client/twinkle/self_host/self_cognition.py

On a CPU machine: a Ray head with 4 logical GPUs (the config's model takes 2, dp_size 2; the sampler
1), the ModelScope cache seeded with the tiny model under ``Qwen/Qwen3.5-4B``, and the one override
this machine needs: vLLM is not installed, so the sampler is the torch one (``--set``). The config's
file persistence (/tmp/twinkle_state.json) and port 8000 are used as they are.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cookbook_launch import (
    launched,
    offline_env,
    ray_head,
    require_port_8000,
    run_script,
    succeeded,
)

pytestmark = pytest.mark.integration

CONFIG = "cookbook/client/server/transformer/server_config.yaml"
STATE_FILE = Path("/tmp/twinkle_state.json")  # the config's persistence.file_path
TORCH_SAMPLER = "applications.sampler-Qwen3.5-4B.args.sampler_type=torch"


@pytest.fixture(scope="module")
def seed_server(tmp_path_factory):
    require_port_8000()
    root = tmp_path_factory.mktemp("seed_steps")
    env = offline_env(root)
    STATE_FILE.unlink(missing_ok=True)  # runs of an earlier server would count against the key
    try:
        with ray_head(env, num_gpus=4) as address:
            with launched(CONFIG, env, address, root / "server.log", "--set", TORCH_SAMPLER):
                yield env, root
    finally:
        STATE_FILE.unlink(missing_ok=True)


def test_the_seed_run_steps(seed_server, tmp_path):
    env, _ = seed_server
    out = succeeded(
        run_script("tinker/self_host/self_cognition.py", env, tmp_path, TWINKLE_MAX_STEPS="2")
    )
    assert out.count("Loss per token:") == 6  # 3 epochs x 2 steps
    assert "Saved checkpoint to tinker://" in out and "twinkle-lora-2" in out

    out = succeeded(
        run_script("twinkle/self_host/self_cognition.py", env, tmp_path, TWINKLE_MAX_STEPS="2")
    )
    assert "- Qwen/Qwen3.5-4B" in out and "'loss':" in out
    assert "Saved checkpoint: twinkle://" in out and "twinkle-epoch-2" in out
