"""Image + text SFT through the Twinkle client: a LoRA tenant learns to answer questions about
pictures (``builtin://self-cognition-vl``), then samples an answer for a picture.

The images travel inside the requests (the client sends bytes, PIL images and local paths as
data URIs; the server checks each one). The server, key, base model and a step cap come from
the environment::

    TWINKLE_SERVER_URL    server address             (default http://localhost:8000)
    TWINKLE_SERVER_TOKEN  API key                    (default EMPTY_API_KEY)
    TWINKLE_BASE_MODEL    served multimodal model    (default Qwen/Qwen3.5-4B)
    TWINKLE_MAX_STEPS     training steps             (default 20)

On a CPU machine: serve the tiny multimodal config and point the script at it::

    export TWINKLE_SERVER_API_KEYS=EMPTY_API_KEY
    twinkle-server launch -c cookbook/client/server/tiny/server_config_vl.yaml
    TWINKLE_BASE_MODEL=tiny/qwen3.5-vl python cookbook/client/twinkle/self_host/multi_modal.py
"""

import os

from twinkle.dataset import Dataset, DatasetMeta
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle_client import init_twinkle_client
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import TorchSampler

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
max_steps = int(os.environ.get("TWINKLE_MAX_STEPS", "20"))

client = init_twinkle_client(base_url=base_url, api_key=api_key)

# Trajectories with one picture each (drawn in code, carried as data URIs); the server renders
# them with the tenant's template, so nothing of the model is needed here.
dataset = Dataset(DatasetMeta("builtin://self-cognition-vl"))
dataset.map(SelfCognitionProcessor("Twinkle", "ModelScope"))
rows = [dataset[i] for i in range(len(dataset))]

model = MultiLoraTransformersModel(model_id=f"ms://{base_model}")
model.add_adapter_to_model("default", {"r": 8, "lora_alpha": 16})  # LoRA on the language model
model.set_template("Qwen3_5Template")
model.set_optimizer("AdamW", lr=2e-2)

batch_size = 4
for step in range(max_steps):
    start = (step * batch_size) % len(rows)
    out = model.forward_backward(inputs=rows[start : start + batch_size])
    model.clip_grad_and_step()
    print(f"step {step} loss {float(out['loss']):.4f}", flush=True)

path = model.save("multi-modal")
print(f"Saved checkpoint: {path}")

sampler = TorchSampler(f"ms://{base_model}")
sampler.set_template("Qwen3_5Template")
question = {"messages": rows[0]["messages"][:1]}  # the picture and the question
result = sampler.sample([question], {"max_tokens": 16, "temperature": 0.0}, adapter_uri=path)
print("Answer:", result[0].sequences[0].text)
