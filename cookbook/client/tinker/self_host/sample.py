"""Sample from a saved checkpoint with the Tinker SDK (the seed's "从检查点采样" example).

Uses ``TWINKLE_CHECKPOINT`` (a ``twinkle://`` or ``tinker://`` path), else the newest checkpoint
of this API key's runs (run ``self_cognition.py`` first), else the base model.

    python cookbook/client/tinker/self_host/sample.py

TWINKLE_SERVER_URL, TWINKLE_SERVER_TOKEN and TWINKLE_BASE_MODEL as in self_cognition.py.
"""

import os

from tinker import types

from twinkle import init_tinker_client
from twinkle.data_format import Message, Trajectory
from twinkle.template import Template

# 在导入 ServiceClient 之前，先初始化 Tinker 客户端
init_tinker_client()

from tinker import ServiceClient  # noqa: E402

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")

service_client = ServiceClient(base_url=base_url, api_key=api_key)


def newest_checkpoint() -> str | None:
    rest_client = service_client.create_rest_client()
    newest = None
    for run in rest_client.list_training_runs().result().training_runs:
        for ckpt in rest_client.list_checkpoints(run.training_run_id).result().checkpoints:
            if newest is None or ckpt.time > newest.time:
                newest = ckpt
    return None if newest is None else newest.tinker_path.replace("tinker://", "twinkle://", 1)


model_path = os.environ.get("TWINKLE_CHECKPOINT") or newest_checkpoint()
print(f"Sampling from {model_path or base_model}")

# 从已保存的检查点创建采样客户端
if model_path:
    sampling_client = service_client.create_sampling_client(
        model_path=model_path, base_model=base_model
    )
else:
    sampling_client = service_client.create_sampling_client(base_model=base_model)

# 使用 Twinkle 的 Template 构建多轮对话输入
template = Template(model_id=f"ms://{base_model}")
trajectory = Trajectory(
    messages=[
        Message(role="system", content="You are a helpful assistant"),
        Message(role="user", content="你是谁？"),
    ]
)
input_feature = template.batch_encode([trajectory], add_generation_prompt=True)[0]
input_ids = input_feature["input_ids"].tolist()

prompt = types.ModelInput.from_ints(input_ids)
params = types.SamplingParams(max_tokens=50, temperature=0.2)  # 低温度，更聚焦的回答

print("Sampling...")
future = sampling_client.sample(prompt=prompt, sampling_params=params, num_samples=8)
result = future.result()

print("Responses:")
for i, seq in enumerate(result.sequences):
    print(f"{i}: {repr(template.decode(seq.tokens))}")
service_client.close("success").result()
