"""Text and image tenants on ONE local multimodal base model, trained in fused steps.

Tenant "text" does text SFT (``builtin://self-cognition``), tenant "vision" learns to answer
questions about pictures (``builtin://self-cognition-vl``) with LoRA on the language model and
the vision tower. Each fused step runs both tenants through one pass (the vision tower sees only
the image rows). Then the image tenant's adapter samples an answer for a picture.

    python cookbook/local/multi_modal.py            # tiny://qwen3.5-vl on a CPU
    TWINKLE_BASE_MODEL=ms://Qwen/Qwen3.5-4B TWINKLE_MAX_STEPS=100 python cookbook/local/multi_modal.py
"""

import os
import tempfile

from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import MultiLoraTransformersModel
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.sampler import TorchSampler

base_model = os.environ.get("TWINKLE_BASE_MODEL", "tiny://qwen3.5-vl")
max_steps = int(os.environ.get("TWINKLE_MAX_STEPS", "20"))
fill = SelfCognitionProcessor("Twinkle", "ModelScope")


def rows(name: str) -> list[dict]:
    dataset = Dataset(DatasetMeta(name))
    dataset.map(fill)
    return [dataset[i] for i in range(len(dataset))]


text_rows, image_rows = rows("builtin://self-cognition"), rows("builtin://self-cognition-vl")

model = MultiLoraTransformersModel(base_model)
model.add_adapter_to_model("text", {"r": 8})  # language model only
vision_targets = ["q_proj", "v_proj", "qkv", "attn.proj", "linear_fc1", "linear_fc2"]
model.add_adapter_to_model("vision", {"r": 8, "target_modules": vision_targets})
for name in ("text", "vision"):
    model.set_template("Qwen3_5Template", adapter_name=name, max_length=256)
    model.set_optimizer("AdamW", lr=2e-2, adapter_name=name)

batch_size = 4
for step in range(max_steps):
    at = step * batch_size
    outputs = model.forward_backward_many(
        {
            "text": {"inputs": text_rows[at % len(text_rows) :][:batch_size]},
            "vision": {"inputs": image_rows[at % len(image_rows) :][:batch_size]},
        }
    )
    for name in ("text", "vision"):
        model.clip_grad_and_step(adapter_name=name)
    losses = " ".join(f"{name} {float(outputs[name]['loss']):.4f}" for name in ("text", "vision"))
    print(f"step {step} loss {losses}", flush=True)

with tempfile.TemporaryDirectory() as out:
    model.save("vision", output_dir=out, adapter_name="vision")
    sampler = TorchSampler(base_model)
    sampler.set_template("Qwen3_5Template")
    question = {"messages": image_rows[0]["messages"][:1]}
    adapter = os.path.join(out, "vision") if os.path.isdir(os.path.join(out, "vision")) else out
    result = sampler.sample([question], {"max_tokens": 16, "temperature": 0.0}, adapter)
    print("Answer:", result[0].sequences[0].text)
