"""seeds/multi_tenant: tenants A (SFT, rank 8) and B (pre-training, rank 32) on ONE local base model.

Each tenant has its own adapter, optimizer, loss and learning rate. Here they take turns (the
time-sliced way); `python -m twinkle.demo` runs the same two tenants through fused steps.
"""

import numpy as np
from peft import LoraConfig

from twinkle import get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.hub import load_tokenizer
from twinkle.model import MultiLoraTransformersModel

logger = get_logger()
base_model = "tiny://qwen3.5"  # the seed: 'ms://Qwen/Qwen3.5-4B'

# Tenant A: private SFT data.
dataset = Dataset(dataset_meta=DatasetMeta("builtin://self-cognition"))
dataset.set_template("Qwen3_5Template", model_id=base_model, max_length=256)
dataset.map(
    "SelfCognitionProcessor",
    init_args={"model_name": "Twinkle", "model_author": "the Twinkle team"},
)
dataset.encode(batched=True)
loader_a = DataLoader(dataset=dataset, batch_size=4, shuffle=True)

# Tenant B: raw text, every token a target.
text = " ".join(
    f"Step {i}: Twinkle trains many LoRA adapters on one shared base model." for i in range(400)
)
ids = np.asarray(load_tokenizer(base_model)(text)["input_ids"])
loader_b = DataLoader(
    dataset=[
        {"input_ids": ids[i : i + 64], "labels": ids[i : i + 64]}
        for i in range(0, len(ids) - 64, 32)
    ],
    batch_size=4,
)

model = MultiLoraTransformersModel(model_id=base_model)

model.add_adapter_to_model("tenant_a", LoraConfig(r=8, lora_alpha=32))
model.set_template("Qwen3_5Template", adapter_name="tenant_a")
model.set_processor("InputProcessor", padding_side="right", adapter_name="tenant_a")
model.set_loss("CrossEntropyLoss", adapter_name="tenant_a")
model.set_optimizer("Adam", lr=1e-2, adapter_name="tenant_a")

model.add_adapter_to_model("tenant_b", LoraConfig(r=32, lora_alpha=64))
model.set_loss("CrossEntropyLoss", adapter_name="tenant_b")
model.set_optimizer("AdamW", lr=3e-3, adapter_name="tenant_b")

for step, (batch_a, batch_b) in enumerate(zip(loader_a, loader_b), start=1):
    model.forward_backward(inputs=batch_a, adapter_name="tenant_a")
    model.clip_grad_and_step(adapter_name="tenant_a")
    model.forward_backward(inputs=batch_b, adapter_name="tenant_b")
    model.clip_grad_and_step(adapter_name="tenant_b")
    if step % 5 == 0:
        for name in ("tenant_a", "tenant_b"):
            logger.info(f"step {step} {name}: {model.calculate_metric(adapter_name=name).result}")

# Weight sync for a sampler (seed: "权重同步").
adapter_path = model.save(name="step-final", save_optimizer=False, adapter_name="tenant_a")
logger.info(f"tenant_a adapter for samplers: {adapter_path}")
