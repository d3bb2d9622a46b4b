# DPO through the Twinkle client, in ModelScope Twinkle's style: the reference model is the base
# model (disable_lora=True), its log-probs go back as ref_outputs, DPOMetric reports the rewards.
import math
import os

from peft import LoraConfig

from twinkle import get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.preprocessor import EmojiDPOProcessor
from twinkle_client import init_twinkle_client
from twinkle_client.model import MultiLoraTransformersModel

logger = get_logger()
base_model = os.environ.get("TWINKLE_MODEL_ID", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_TOKEN")
beta = 0.1

init_twinkle_client(base_url=base_url, api_key=api_key)

dataset = Dataset(DatasetMeta("ms://hjh0119/shareAI-Llama3-DPO-zh-en-emoji", data_slice=range(8)))
dataset.set_template("Qwen3_5Template", model_id=f"ms://{base_model}", max_length=256)
dataset.map(EmojiDPOProcessor, init_args={"system": "You are a helpful assistant."})
dataset.encode()
dataloader = DataLoader(dataset=dataset, batch_size=2)

model = MultiLoraTransformersModel(model_id=f"ms://{base_model}")
model.add_adapter_to_model("dpo", LoraConfig(target_modules="all-linear", r=8, lora_alpha=32))
model.set_template("Qwen3_5Template")
model.set_processor("InputProcessor", padding_side="right")
model.set_loss("DPOLoss", beta=beta, loss_type="sigmoid", reference_free=False, sft_weight=0.0)
model.add_metric("DPOMetric", beta=beta)
model.set_optimizer("Adam", lr=1e-3)

losses = []
for step, batch in enumerate(dataloader):
    pairs = []
    for row in batch:  # [chosen_1, rejected_1, chosen_2, ...]
        pairs += [dict(row["positive"]), dict(row["negative"])]
    reference = model.forward_only(inputs=pairs, disable_lora=True)
    assert "loss" not in reference.result and len(reference.result["logprobs"]) == len(pairs)
    out = model.forward_backward(inputs=pairs, ref_outputs=reference.result)
    losses.append(out["loss"])
    model.clip_grad_and_step()
    metric = model.calculate_metric(is_training=True).result
    logger.info(f"step {step}: loss={out['loss']:.4f} {metric}")
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"} <= set(
        metric
    )
    if step == 0:
        # A fresh LoRA (B = 0) is the base model: policy == reference, every margin is 0.
        assert math.isclose(losses[0], math.log(2), rel_tol=1e-4), losses[0]
        assert abs(metric["rewards/margins"]) < 1e-4, metric

assert len(losses) == 4 and losses[-1] < losses[0], losses
path = model.save(name="dpo-final")
assert path.startswith("twinkle://") and path.twinkle_path == path
logger.info(f"DPO conformance passed: losses {losses}, saved {path}")
