"""DPO through the Tinker SDK: a custom loss on the server's log-probabilities.

``forward_backward_custom`` gets the policy's target log-probs from the server, computes the DPO
loss and its gradient here, and sends the gradient back as per-token weights: the server only ever
runs its built-in ``cross_entropy``. Reference log-probs come from the untouched adapter (LoRA's B
starts at zero, so the first forward IS the base model).

    python cookbook/client/tinker/self_host/dpo.py     (TWINKLE_MAX_STEPS, default 6)

TWINKLE_SERVER_URL, TWINKLE_SERVER_TOKEN and TWINKLE_BASE_MODEL as in self_cognition.py.
"""

import os

import torch

from twinkle import init_tinker_client
from twinkle.data_format import Message, Trajectory
from twinkle.template import Template

init_tinker_client()

from tinker import ServiceClient, types  # noqa: E402

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
steps = int(os.environ.get("TWINKLE_MAX_STEPS", "6"))
beta = 0.1

template = Template(model_id=f"ms://{base_model}")
pairs = [
    ("你是谁？", "我是twinkle模型，由twinkle团队开发。", "我是一个普通的程序。"),
    ("Who are you?", "I am twinkle, trained by the twinkle team.", "I do not know."),
]


def datum(question: str, answer: str) -> types.Datum:
    prompt = Trajectory(messages=[Message(role="user", content=question)])
    full = Trajectory(
        messages=[Message(role="user", content=question), Message(role="assistant", content=answer)]
    )
    n_prompt = len(template.batch_encode([prompt], add_generation_prompt=True)[0]["input_ids"])
    tokens = template.batch_encode([full])[0]["input_ids"].tolist()
    weights = [0.0] * (n_prompt - 1) + [1.0] * (len(tokens) - n_prompt)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


# chosen, rejected, chosen, rejected, ...
data = [d for q, chosen, rejected in pairs for d in (datum(q, chosen), datum(q, rejected))]
masks = [torch.tensor(d.loss_fn_inputs["weights"].to_numpy()) for d in data]

service_client = ServiceClient(base_url=base_url, api_key=api_key)
training_client = service_client.create_lora_training_client(base_model=base_model, rank=8).result()
reference = training_client.forward(data, "cross_entropy").result()
ref_logps = [
    float((torch.tensor(o["logprobs"].to_numpy()) * m).sum())
    for o, m in zip(reference.loss_fn_outputs, masks)
]


def dpo_loss(batch, logprobs_list):
    """-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), averaged over pairs."""
    seq_logps = [(lp * m).sum() for lp, m in zip(logprobs_list, masks)]
    margins = []
    for i in range(0, len(seq_logps), 2):
        chosen = seq_logps[i] - ref_logps[i]
        rejected = seq_logps[i + 1] - ref_logps[i + 1]
        margins.append(beta * (chosen - rejected))
    margins = torch.stack(margins)
    loss = -torch.nn.functional.logsigmoid(margins).mean()
    return loss, {
        "dpo_margin:mean": float(margins.mean()),
        "dpo_acc:mean": float((margins > 0).float().mean()),
    }


for step in range(steps):
    result = training_client.forward_backward_custom(data, dpo_loss).result()
    training_client.optim_step(types.AdamParams(learning_rate=5e-3)).result()
    print(
        f"step {step}: loss {result.metrics['loss:sum']:.4f}, margin {result.metrics['dpo_margin:mean']:.4f}"
    )

service_client.close("success").result()
