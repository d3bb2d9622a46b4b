"""GRPO on tiny additions through the Tinker SDK: sample, reward, importance-sampling step.

Task: the user asks ``a+b=`` (a, b in 0..2); the reward is 1 for the right sum. A few SFT steps
first teach the tiny random model the answer format. Each RL step:

    sampling_client = training_client.save_weights_and_get_sampling_client()
    sequences = sampling_client.sample(prompt, num_samples=G)           # with sampler logprobs
    advantages = reward - mean(reward of the group)
    training_client.forward_backward(datums, 'importance_sampling')     # -exp(lp - q) * A
    training_client.optim_step(...)

    python cookbook/client/tinker/self_host/short_math_grpo.py

TWINKLE_MAX_STEPS: RL steps (default 6); TWINKLE_WARMUP_STEPS: SFT warm-up steps (default 40);
TWINKLE_SERVER_URL, TWINKLE_SERVER_TOKEN and TWINKLE_BASE_MODEL as in self_cognition.py.
"""

import os
import random

import numpy as np

from twinkle import init_tinker_client
from twinkle.data_format import Message, Trajectory
from twinkle.template import Template

init_tinker_client()

from tinker import ServiceClient, types  # noqa: E402

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
warmup_steps = int(os.environ.get("TWINKLE_WARMUP_STEPS", "40"))
rl_steps = int(os.environ.get("TWINKLE_MAX_STEPS", "6"))
group_size = 4
rng = random.Random(0)

template = Template(model_id=f"ms://{base_model}")
pairs = [(a, b) for a in range(3) for b in range(3)]


def prompt_ids(a: int, b: int) -> list[int]:
    trajectory = Trajectory(messages=[Message(role="user", content=f"{a}+{b}=")])
    return template.batch_encode([trajectory], add_generation_prompt=True)[0]["input_ids"].tolist()


def answer_ids(a: int, b: int) -> list[int]:
    full = Trajectory(
        messages=[
            Message(role="user", content=f"{a}+{b}="),
            Message(role="assistant", content=str(a + b)),
        ]
    )
    return template.batch_encode([full])[0]["input_ids"].tolist()[len(prompt_ids(a, b)) :]


def datum(prompt: list[int], completion: list[int], **per_token) -> types.Datum:
    """Targets are the completion; per-token inputs are 0 on the prompt."""
    tokens = prompt + completion
    pad = [0.0] * (len(prompt) - 1)
    inputs = {"target_tokens": tokens[1:]}
    inputs.update({k: pad + list(v) for k, v in per_token.items()})
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


service_client = ServiceClient(base_url=base_url, api_key=api_key)
training_client = service_client.create_lora_training_client(
    base_model=base_model, rank=16
).result()

for step in range(warmup_steps):
    batch = [
        datum(prompt_ids(a, b), answer_ids(a, b), weights=[1.0] * len(answer_ids(a, b)))
        for a, b in pairs
    ] * 2
    result = training_client.forward_backward(batch, "cross_entropy")
    training_client.optim_step(types.AdamParams(learning_rate=5e-3)).result()
    print(f"warm-up {step}: loss {result.result().metrics['loss:sum']:.2f}")

for step in range(rl_steps):
    sampling_client = training_client.save_weights_and_get_sampling_client().result()
    problems = rng.sample(pairs, 4)
    futures = [
        sampling_client.sample(
            types.ModelInput.from_ints(prompt_ids(a, b)),
            num_samples=group_size,
            sampling_params=types.SamplingParams(max_tokens=6, temperature=1.0, seed=step),
        )
        for a, b in problems
    ]
    batch, all_rewards = [], []
    for (a, b), future in zip(problems, futures):
        sequences = future.result().sequences
        rewards = np.array(
            [
                float(template.decode(s.tokens).split("<")[0].strip() == str(a + b))
                for s in sequences
            ]
        )
        advantages = rewards - rewards.mean()
        all_rewards.extend(rewards)
        for seq, adv in zip(sequences, advantages):
            if adv != 0 and seq.tokens:
                batch.append(
                    datum(
                        prompt_ids(a, b),
                        seq.tokens,
                        logprobs=seq.logprobs,
                        advantages=[float(adv)] * len(seq.tokens),
                    )
                )
    if batch:
        training_client.forward_backward(batch, "importance_sampling").result()
        training_client.optim_step(types.AdamParams(learning_rate=5e-3)).result()
    print(repr(template.decode(sequences[0].tokens)))
    print(
        f"rl step {step}: mean reward {np.mean(all_rewards):.2f}, {len(batch)} sequences with signal"
    )

service_client.close("success").result()
