"""The smallest Tinker SDK loop against a Twinkle server: LoRA SFT on a few sentences, then sample.

    export TWINKLE_SERVER_API_KEYS=EMPTY_API_KEY
    twinkle-server launch -c cookbook/client/server/transformer/server_config.yaml
    python cookbook/client/tinker/self_host/lora.py     (TWINKLE_MAX_STEPS, default 10)

TWINKLE_SERVER_URL, TWINKLE_SERVER_TOKEN and TWINKLE_BASE_MODEL as in self_cognition.py.
"""

import os

from twinkle import init_tinker_client

init_tinker_client()

from tinker import ServiceClient, types  # noqa: E402

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
steps = int(os.environ.get("TWINKLE_MAX_STEPS", "10"))

service_client = ServiceClient(base_url=base_url, api_key=api_key)
training_client = service_client.create_lora_training_client(base_model=base_model, rank=8).result()
tokenizer = training_client.get_tokenizer()

examples = [
    ("English: hello world\nPig Latin:", " ellohay orldway"),
    ("English: coffee break\nPig Latin:", " offeecay eakbray"),
    ("English: banana split\nPig Latin:", " ananabay itsplay"),
]


def make_datum(prompt: str, completion: str) -> types.Datum:
    """Train only on the completion: weights are 0 on the prompt, 1 on the completion."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    completion_ids = tokenizer.encode(completion, add_special_tokens=False)
    tokens = prompt_ids + completion_ids
    weights = [0.0] * len(prompt_ids) + [1.0] * len(completion_ids)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]},
    )


data = [make_datum(p, c) for p, c in examples]
for step in range(steps):
    fwdbwd = training_client.forward_backward(data, "cross_entropy")
    optim = training_client.optim_step(types.AdamParams(learning_rate=5e-3))
    result = fwdbwd.result()
    tokens = sum(d.loss_fn_inputs["weights"].to_numpy().sum() for d in data)
    print(
        f"step {step}: loss per token {result.metrics['loss:sum'] / tokens:.3f}, {optim.result().metrics}"
    )

sampling_client = training_client.save_weights_and_get_sampling_client().result()
prompt = types.ModelInput.from_ints(tokenizer.encode(examples[0][0], add_special_tokens=False))
params = types.SamplingParams(max_tokens=8, temperature=0.0, stop=["\n"])
result = sampling_client.sample(prompt=prompt, sampling_params=params, num_samples=2).result()
for i, seq in enumerate(result.sequences):
    print(f"{i}: {tokenizer.decode(seq.tokens)!r}")
service_client.close("success").result()
