"""Sample configs for the config tests: the shipped cookbook YAMLs and one that sets every field."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
COOKBOOK_CONFIGS = sorted((REPO / "cookbook" / "client" / "server").glob("*/*.yaml"))
MEGATRON = REPO / "cookbook" / "client" / "server" / "megatron" / "server_config.yaml"
TINY = REPO / "cookbook" / "client" / "server" / "tiny" / "server_config.yaml"


def full_config_data() -> dict:
    """The seed's Megatron example plus every optional section and field set."""
    data = yaml.safe_load(MEGATRON.read_text())
    data["http_options"]["request_timeout_s"] = 30
    data["telemetry"]["resource_attributes"] = {"env": "test"}
    data["auth"] = {"api_keys": ["secret-key"], "api_keys_file": "/tmp/keys.txt"}
    data["storage"] = {"root": "/tmp/twinkle-test-storage"}
    data["hub"] = {"endpoint": "http://127.0.0.1:9", "namespace": "org", "caller_key": "first"}
    server = data["applications"][0]
    server["args"].update(checkpoint_ttl_s=3600, keep_last_checkpoints=2)
    deployment = server["deployments"][0]
    deployment["ray_actor_options"].update(
        num_gpus=0, memory=1024, resources={"head": 0.1}, runtime_env={"env_vars": {"A": "1"}}
    )
    deployment["runtime_env"] = {"env_vars": {"B": "2"}, "pip": ["x"], "working_dir": "."}
    model = data["applications"][1]["args"]
    model["torch_dtype"] = "bfloat16"
    model["execution"] = {
        "lora_kernel": "torch",
        "direct_weight_grads": True,
        "small_gemm_one_thread": True,
        "small_tensor_elements": 32768,
        "logprob_chunk_bytes": 1 << 20,
        "fused_adam": True,
        "malloc_tuning": False,
        "cpu_threads": 4,
    }
    model["queue_config"]["max_fuse_wait_ms"] = 5
    for app in data["applications"]:
        if app["import_path"] == "sampler":
            app["args"]["execution"] = {"lora_kernel": "auto", "cpu_threads": 2}
    return data


def tiny_config_data() -> dict:
    """The tiny cookbook config as plain data."""
    return yaml.safe_load(TINY.read_text())
