"""GRPO on tiny additions with the seed's RL loop (tenant B of multi_tenant), locally, on CPU.

Task: the user asks ``a+b=`` (a, b in 0..2); the completion must be the sum and nothing else.
Reward: 1.0 for the right sum (``MathReward``) plus 0.25 when the completion is a bare integer
(``FormatReward``). The tiny random model knows no arithmetic, so a few SFT steps first teach it the
answer format and part of the table; then every step is the seed's loop:

    adapter_path = model.save(...)                       # weight sync: the sampler loads it
    responses = sampler.sample(inputs, adapter_uri=adapter_path)
    rewards -> advantages
    model.forward_backward(inputs=responses, advantages=advantages)
    model.clip_grad_and_step()

Run: ``python cookbook/local/short_math_grpo.py`` (one to two minutes on 2 CPU cores).
"""

import random
import tempfile
import time

import numpy as np
import torch
from peft import LoraConfig

from twinkle.data_format import Message, Trajectory
from twinkle.model import MultiLoraTransformersModel
from twinkle.rl import FormatReward, GRPOAdvantage, MathReward
from twinkle.sampler import TorchSampler

base_model = "tiny://qwen3.5"  # the seed: 'ms://Qwen/Qwen3.5-4B'
warmup_steps = 40
grpo_steps = 30
prompts_per_step = 8
num_samples = 8  # the GRPO group size
torch.manual_seed(0)
rng = random.Random(0)


def problem(a: int, b: int, with_answer: bool = False) -> Trajectory:
    messages = [Message(role="user", content=f"{a}+{b}=")]
    if with_answer:
        messages.append(Message(role="assistant", content=str(a + b)))
    return Trajectory(messages=messages, extra={"answer": a + b})


pairs = [(a, b) for a in range(3) for b in range(3)]

# The trainer: tenant "math" with a GRPO loss.
model = MultiLoraTransformersModel(model_id=base_model)
model.add_adapter_to_model("math", LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
model.set_template("Qwen3_5Template", model_id=base_model)
model.set_optimizer("Adam", lr=5e-3)

# The sampler: same base model, adapters loaded from what model.save writes.
output_dir = tempfile.mkdtemp(prefix="short-math-grpo-")
sampler = TorchSampler(model_id=base_model, max_loras=2, allowed_adapter_dirs=[output_dir])
sampler.set_template("Qwen3_5Template", model_id=base_model)

# SFT warm-up on the answer format (cross-entropy on a few worked sums).
model.set_loss("CrossEntropyLoss")
for step in range(warmup_steps):
    batch = [problem(*rng.choice(pairs), with_answer=True) for _ in range(16)]
    out = model.forward_backward(inputs=batch)
    model.clip_grad_and_step()
    if step % 5 == 4:
        print(f"warm-up step {step + 1}: sft loss {out['loss']:.3f}")

# GRPO: sample, reward, group-normalised advantages, policy-gradient step.
model.set_loss("GRPOLoss", epsilon=0.2)
model.set_optimizer("Adam", lr=1e-3)  # a fresh optimizer, gentler than the warm-up's
math_reward, format_reward = MathReward(), FormatReward(pattern=r"-?\d+")
advantage_fn = GRPOAdvantage(group_size=num_samples)
history = []
start = time.time()
for step in range(grpo_steps):
    adapter_path = model.save(f"step-{step}", output_dir=output_dir, save_optimizer=False)
    inputs = [problem(*rng.choice(pairs)) for _ in range(prompts_per_step)]
    responses = sampler.sample(
        inputs=inputs,
        sampling_params={"max_tokens": 4, "temperature": 0.5, "num_samples": num_samples},
        adapter_uri=adapter_path,
    )
    correct = math_reward(responses)
    rewards = correct + 0.25 * format_reward(responses)
    advantages = advantage_fn(rewards)
    model.forward_backward(inputs=responses.features(), advantages=advantages)
    model.clip_grad_and_step()
    history.append(float(rewards.mean()))
    print(f"grpo step {step + 1}: mean reward {rewards.mean():.3f} (accuracy {correct.mean():.3f})")

first, last = np.mean(history[:5]), np.mean(history[-5:])
print(
    f"mean reward, first 5 steps {first:.3f} -> last 5 steps {last:.3f} ({time.time() - start:.0f} s of GRPO)"
)
