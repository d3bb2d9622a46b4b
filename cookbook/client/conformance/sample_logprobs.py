# Sampling with per-token logprobs through the Twinkle client, in ModelScope Twinkle's style:
# logprobs=1 gives, per sampled token, [(token_id, logprob)], and new_input_feature is the prompt
# plus the completion ready to train on. The sampler's log-probs equal the trainer's.
import math
import os

from peft import LoraConfig

from twinkle import get_logger, init_twinkle_client
from twinkle.data_format import Message, SamplingParams, Trajectory

logger = get_logger()
MODEL_ID = f"ms://{os.environ.get('TWINKLE_MODEL_ID', 'Qwen/Qwen3.5-4B')}"

client = init_twinkle_client(
    base_url=os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000"),
    api_key=os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_TOKEN"),
)
model = client.model(MODEL_ID)
model.add_adapter_to_model("default", LoraConfig(target_modules="all-linear", r=8, lora_alpha=16))
model.set_template("Qwen3_5Template", model_id=MODEL_ID)
model.set_processor("InputProcessor")
model.set_optimizer("Adam", lr=1e-3)
path = model.save(name="sampler-weights", is_sampler=True)

sampler = client.sampler(MODEL_ID)
sampler.set_template("Qwen3_5Template", model_id=MODEL_ID)
prompts = [
    Trajectory(messages=[Message(role="user", content="Name a colour.")]),
    Trajectory(messages=[Message(role="user", content="Count to three.")]),
]
params = SamplingParams(max_tokens=12, temperature=1.0, num_samples=2, logprobs=1, seed=7)
responses = sampler.sample(inputs=prompts, sampling_params=params, adapter_uri=path.twinkle_path)

features, sampled = [], []
for response in responses:
    assert len(response.sequences) == 2
    for sequence in response.sequences:
        assert len(sequence.logprobs) == len(sequence.tokens)
        for token, position in zip(sequence.tokens, sequence.logprobs):
            assert position[0][0] == token, (position, token)  # the sampled token comes first
            assert position[0][1] <= 0.0
        feature = sequence.new_input_feature
        prompt_len = len(feature["input_ids"]) - len(sequence.tokens)
        assert list(feature["labels"][:prompt_len]) == [-100] * prompt_len
        assert list(feature["labels"][prompt_len:]) == list(sequence.tokens)
        assert feature["messages"][-1]["role"] == "assistant"
        features.append(feature)
        sampled.append([lp[0][1] for lp in sequence.logprobs])

# The trainer scores the same tokens with the same weights: the same log-probs.
scored = model.forward_only(inputs=features)
worst = 0.0
for row, expected in zip(scored.result["logprobs"], sampled):
    assert len(row) == len(expected)
    worst = max(worst, max(abs(a - b) for a, b in zip(row, expected)))
assert worst < 2e-3, worst
logger.info(f"sampling conformance passed: {len(features)} sequences, max |dlogprob| {worst:.2e}")
assert math.isfinite(scored.result["loss"])
