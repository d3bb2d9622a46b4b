"""Inference only through the Twinkle client (tenant C of the multi-tenant guide).

Samples answers from the server's base model and, when this API key has a checkpoint (for
example from ``self_cognition.py``), from that adapter too, by its ``twinkle://`` path.

    export TWINKLE_SERVER_API_KEYS=EMPTY_API_KEY
    twinkle-server launch -c cookbook/client/server/transformer/server_config.yaml
    python cookbook/client/twinkle/self_host/sample.py

TWINKLE_SERVER_URL, TWINKLE_SERVER_TOKEN and TWINKLE_BASE_MODEL as in self_cognition.py.
"""

import os

from twinkle_client import init_twinkle_client
from twinkle_client.data_format import Message, Trajectory
from twinkle_client.sampler import vLLMSampler

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")

client = init_twinkle_client(base_url=base_url, api_key=api_key)

# The most recent training checkpoint of this key, if any.
adapter_uri = None
for run in client.list_training_runs(limit=20):
    adapter_uri = client.get_latest_checkpoint_path(run.training_run_id)
    if adapter_uri:
        break

# The server's sampler config decides the engine (torch for the tiny model, vLLM on GPUs);
# the client class only names the API the script was written against.
sampler = vLLMSampler(model_id=f"ms://{base_model}")
sampler.set_template("Qwen3_5Template")

prompts = [
    Trajectory(messages=[Message(role="user", content="Who are you?")]),
    Trajectory(messages=[Message(role="user", content="What can you do?")]),
]
sampling_params = {"max_tokens": 24, "temperature": 0.7, "num_samples": 2, "seed": 0}

for label, uri in [("base model", None), (f"adapter {adapter_uri}", adapter_uri)]:
    if label.startswith("adapter") and uri is None:
        print("No checkpoint yet: run self_cognition.py first to sample from an adapter.")
        continue
    responses = sampler.sample(inputs=prompts, sampling_params=sampling_params, adapter_uri=uri)
    print(f"== {label}")
    for prompt, result in zip(prompts, responses):
        for sequence in result.sequences:
            print(
                f"{prompt.messages[0].content!r} -> {sequence.text!r} "
                f"({len(sequence.tokens)} tokens, {sequence.stop_reason})"
            )
