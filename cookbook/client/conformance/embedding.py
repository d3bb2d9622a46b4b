# Embedding training through the Twinkle client, in ModelScope Twinkle's style: InfoNCE over
# [anchor, positive, ...] rows with task='embedding' and EmbeddingMetric.
import os

from peft import LoraConfig

from twinkle import get_logger, init_twinkle_client
from twinkle.template import Qwen3_5Template

logger = get_logger()
MODEL_ID = f"ms://{os.environ.get('TWINKLE_MODEL_ID', 'Qwen/Qwen3.5-4B')}"
PAIRS = [
    ("Where is the Eiffel tower?", "The Eiffel tower stands in Paris."),
    ("What do bees make?", "Bees make honey from nectar."),
    ("How many legs has a spider?", "A spider has eight legs."),
    ("What colour is the sky?", "On a clear day the sky is blue."),
]

client = init_twinkle_client(
    base_url=os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000"),
    api_key=os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_TOKEN"),
)
model = client.model(MODEL_ID)
model.add_adapter_to_model("emb", LoraConfig(target_modules="all-linear", r=8, lora_alpha=16))
model.set_template("Qwen3_5Template", model_id=MODEL_ID)
model.set_processor("InputProcessor")
model.set_loss("InfonceLoss", temperature=0.07, use_batch=True, hard_negatives=None)
model.set_optimizer("Adam", lr=2e-3)
model.add_metric("EmbeddingMetric", is_training=True)

tokenizer = Qwen3_5Template(model_id=MODEL_ID, max_length=128).tokenizer
rows = []
for anchor, positive in PAIRS:
    for text, label in ((anchor, 1), (positive, 0)):
        ids = tokenizer.encode(text, add_special_tokens=True)
        rows.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": [label]})

losses = []
for step in range(8):
    out = model.forward_backward(inputs=rows, task="embedding")
    losses.append(out["loss"])
    assert len(out["embeddings"]) == len(rows)
    model.clip_grad_and_step(max_grad_norm=1.0)
    metric = model.calculate_metric(is_training=True).result
    logger.info(f"step {step}: {metric}")
    assert {"pos_sim", "neg_sim"} <= set(metric), metric

assert losses[-1] < losses[0], losses
logger.info(f"embedding conformance passed: InfoNCE {losses[0]:.4f} -> {losses[-1]:.4f}")
