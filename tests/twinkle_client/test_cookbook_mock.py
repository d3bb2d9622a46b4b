"""Every client script against the unmodified mock config (``backend: mock``, ``sampler_type: mock``).

The scripts the numpy mock can run exit 0; the others fail with an error that names the mock.
Each script gets its own key: a Tinker script's ``close()`` finishes its session but the server
keeps its adapter until ``adapter_timeout``, and ``per_token_model_limit`` is 3.
"""

from __future__ import annotations

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

CONFIG = "cookbook/client/server/mock/server_config.yaml"
SUPPORTED = {
    "tinker/self_host/self_cognition.py": "Saved checkpoint to tinker://",
    "tinker/self_host/dpo.py": "step 1: loss",
    "tinker/self_host/lora.py": "step 1: loss per token",
    "tinker/self_host/sample.py": "Responses:",
    "tinker/self_host/short_math_grpo.py": "rl step 1: mean reward",
    "twinkle/self_host/sample.py": "== base model",
}
REFUSED = {
    "twinkle/self_host/dpo.py": "the mock model supports the losses",
    "twinkle/self_host/short_math_grpo.py": "the mock backend trains on encoded rows only",
}
KEYS = [f"key-{i}" for i in range(len(SUPPORTED) + len(REFUSED) + 1)]


@pytest.fixture(scope="module")
def mock_server(tmp_path_factory):
    require_port_8000()
    root = tmp_path_factory.mktemp("mock_steps")
    env = offline_env(root)
    env.update(TWINKLE_SERVER_API_KEYS=",".join(KEYS), TWINKLE_BASE_MODEL="tiny/qwen3.5")
    env.update(TWINKLE_MAX_STEPS="2", TWINKLE_WARMUP_STEPS="2")
    with ray_head(env, num_gpus=0) as address:
        with launched(CONFIG, env, address, root / "server.log"):
            yield env


@pytest.mark.parametrize("script", sorted(SUPPORTED))
def test_supported_script_runs(mock_server, script, tmp_path):
    key = KEYS[sorted(SUPPORTED).index(script)]
    out = succeeded(run_script(script, mock_server, tmp_path, TWINKLE_SERVER_TOKEN=key))
    assert SUPPORTED[script] in out


@pytest.mark.parametrize("script", sorted(REFUSED))
def test_unsupported_script_is_refused_naming_the_mock(mock_server, script, tmp_path):
    key = KEYS[len(SUPPORTED) + sorted(REFUSED).index(script)]
    result = run_script(script, mock_server, tmp_path, TWINKLE_SERVER_TOKEN=key)
    assert result.returncode != 0 and REFUSED[script] in result.stdout, result.stdout[-3000:]


def test_twinkle_self_cognition_runs(mock_server, tmp_path):
    result = run_script(
        "twinkle/self_host/self_cognition.py", mock_server, tmp_path, TWINKLE_SERVER_TOKEN=KEYS[-1]
    )
    assert "twinkle-epoch-2" in succeeded(result)
