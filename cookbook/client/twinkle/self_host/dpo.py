"""DPO through the Twinkle client: preference pairs, reference log-probs from the frozen base model.

Rows come in (chosen, rejected) pairs; ``DPOLoss`` compares the adapter's log-probabilities with
the base model's (the server computes the reference by running the base model without the
adapter, so nothing extra is sent).

    export TWINKLE_SERVER_API_KEYS=EMPTY_API_KEY
    twinkle-server launch -c cookbook/client/server/transformer/server_config.yaml
    python cookbook/client/twinkle/self_host/dpo.py     (TWINKLE_MAX_STEPS, default 10)

TWINKLE_SERVER_URL, TWINKLE_SERVER_TOKEN and TWINKLE_BASE_MODEL as in self_cognition.py.
"""

import os

from twinkle_client import init_twinkle_client
from twinkle_client.data_format import Message, Trajectory
from twinkle_client.model import MultiLoraTransformersModel

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
steps = int(os.environ.get("TWINKLE_MAX_STEPS", "10"))

preferences = [
    ("Describe a cat.", "A cat is a small, curious and affectionate animal.", "Cats. Whatever."),
    ("How do I say thanks?", 'You can say "thank you very much".', "Do not bother."),
    ("What is 2+2?", "2+2 equals 4.", "2+2 equals 5."),
    ("Give me a tip for learning.", "Practice a little every day.", "Never practice."),
]


def conversation(prompt: str, answer: str) -> Trajectory:
    return Trajectory(
        messages=[Message(role="user", content=prompt), Message(role="assistant", content=answer)]
    )


# Row 2i is the chosen answer, row 2i+1 the rejected one, for the same prompt.
batch = [
    conversation(p, answer) for p, chosen, rejected in preferences for answer in (chosen, rejected)
]

client = init_twinkle_client(base_url=base_url, api_key=api_key)
model = MultiLoraTransformersModel(model_id=f"ms://{base_model}")
model.add_adapter_to_model("dpo", {"r": 8, "lora_alpha": 16, "target_modules": "all-linear"})
model.set_template("Qwen3_5Template")
model.set_loss("DPOLoss", beta=0.1)
model.set_optimizer("Adam", lr=2e-3)

for step in range(steps):
    out = model.forward_backward(inputs=batch)
    model.clip_grad_and_step()
    metric = model.calculate_metric(is_training=True).result
    print(
        f"dpo step {step + 1}: loss {out['loss']:.4f}, reward accuracy "
        f"{metric.get('reward_accuracy')}, margin {metric.get('reward_margin')}"
    )

print("saved:", model.save("dpo-final"))
