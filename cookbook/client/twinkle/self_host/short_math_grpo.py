"""GRPO on tiny additions through the Twinkle client: cookbook/local/short_math_grpo.py, remote.

The same loop as the local recipe (and tenant B of the multi-tenant guide), with the model and the
sampler on the server; only ``twinkle_client`` is needed on this machine (rewards are plain
Python here):

    adapter_path = model.save(...)                        # weight sync: the sampler loads it
    responses = sampler.sample(inputs, adapter_uri=adapter_path)
    rewards -> advantages
    model.forward_backward(inputs=responses.features(), advantages=advantages)
    model.clip_grad_and_step()

    export TWINKLE_SERVER_API_KEYS=EMPTY_API_KEY
    twinkle-server launch -c cookbook/client/server/transformer/server_config.yaml
    python cookbook/client/twinkle/self_host/short_math_grpo.py

TWINKLE_MAX_STEPS: GRPO steps (default 6); TWINKLE_WARMUP_STEPS: SFT warm-up steps (default 30);
TWINKLE_SERVER_URL, TWINKLE_SERVER_TOKEN and TWINKLE_BASE_MODEL as in self_cognition.py.
"""

import os
import random
import re

import numpy as np

from twinkle_client import init_twinkle_client
from twinkle_client.data_format import Message, Trajectory
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import TorchSampler

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
warmup_steps = int(os.environ.get("TWINKLE_WARMUP_STEPS", "30"))
grpo_steps = int(os.environ.get("TWINKLE_MAX_STEPS", "6"))
prompts_per_step = 4
num_samples = 4  # the GRPO group size
rng = random.Random(0)


def problem(a: int, b: int, with_answer: bool = False) -> Trajectory:
    messages = [Message(role="user", content=f"{a}+{b}=")]
    if with_answer:
        messages.append(Message(role="assistant", content=str(a + b)))
    return Trajectory(messages=messages, extra={"answer": a + b})


def rewards_of(responses) -> tuple[np.ndarray, np.ndarray]:
    """1.0 for the right sum, plus 0.25 for a bare integer; one value per sampled sequence."""
    correct, formatted = [], []
    for result in responses:
        for sequence in result.sequences:
            text = sequence.text.strip()
            formatted.append(float(re.fullmatch(r"-?\d+", text) is not None))
            correct.append(float(text == str(result.extra["answer"])))
    return np.asarray(correct), np.asarray(formatted)


def group_advantages(rewards: np.ndarray, group_size: int) -> np.ndarray:
    groups = rewards.reshape(-1, group_size)
    return (
        (groups - groups.mean(1, keepdims=True)) / (groups.std(1, keepdims=True) + 1e-4)
    ).reshape(-1)


pairs = [(a, b) for a in range(3) for b in range(3)]
client = init_twinkle_client(base_url=base_url, api_key=api_key)

# The trainer: adapter "math" on the server's shared base model.
model = MultiLoraTransformersModel(model_id=f"ms://{base_model}")
model.add_adapter_to_model("math", {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"})
model.set_template("Qwen3_5Template")
model.set_optimizer("Adam", lr=5e-3)

# The sampler: same base model, adapters loaded from the checkpoints model.save returns.
sampler = TorchSampler(model_id=f"ms://{base_model}")
sampler.set_template("Qwen3_5Template")

# SFT warm-up on the answer format.
model.set_loss("CrossEntropyLoss")
for step in range(warmup_steps):
    batch = [problem(*rng.choice(pairs), with_answer=True) for _ in range(16)]
    out = model.forward_backward(inputs=batch)
    model.clip_grad_and_step()
    if step % 5 == 4:
        print(f"warm-up step {step + 1}: sft loss {out['loss']:.3f}")

# GRPO: sample, reward, group-normalised advantages, policy-gradient step.
model.set_loss("GRPOLoss", epsilon=0.2)
model.set_optimizer("Adam", lr=1e-3)
history = []
for step in range(grpo_steps):
    adapter_path = model.save(f"grpo-step-{step}", kind="sampler")
    inputs = [problem(*rng.choice(pairs)) for _ in range(prompts_per_step)]
    responses = sampler.sample(
        inputs=inputs,
        sampling_params={
            "max_tokens": 4,
            "temperature": 0.5,
            "num_samples": num_samples,
            "seed": step,
        },
        adapter_uri=adapter_path,
    )
    correct, formatted = rewards_of(responses)
    rewards = correct + 0.25 * formatted
    model.forward_backward(
        inputs=responses.features(), advantages=group_advantages(rewards, num_samples)
    )
    model.clip_grad_and_step()
    history.append(float(rewards.mean()))
    print(f"grpo step {step + 1}: mean reward {rewards.mean():.3f} (accuracy {correct.mean():.3f})")

print(f"mean reward over {grpo_steps} GRPO steps: {np.mean(history):.3f}")
