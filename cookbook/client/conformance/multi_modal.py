# Image-text SFT through the Twinkle client, in ModelScope Twinkle's style: a LazyDataset whose
# preprocessor builds Message(images=[...]) rows; the images reach the encoded samples and the
# server trains on them.
import math
import os

from peft import LoraConfig

from twinkle import get_logger, init_twinkle_client
from twinkle.data_format import Message, Trajectory
from twinkle.dataloader import DataLoader
from twinkle.dataset import DatasetMeta, LazyDataset
from twinkle.preprocessor import Preprocessor
from twinkle_client.model import MultiLoraTransformersModel

logger = get_logger()
base_model = os.environ.get("TWINKLE_MODEL_ID", "Qwen/Qwen3.5-4B")


class LatexOCR(Preprocessor):
    def __call__(self, rows):
        return self.map_row_to_col([self.preprocess(row) for row in self.map_col_to_row(rows)])

    def preprocess(self, row):
        return Trajectory(
            messages=[
                Message(
                    role="user",
                    content="<image>Write the LaTeX of this image.",
                    images=[row["image"]],
                ),
                Message(role="assistant", content=row["text"]),
            ]
        )


init_twinkle_client(
    base_url=os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000"),
    api_key=os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_TOKEN"),
)
dataset = LazyDataset(dataset_meta=DatasetMeta("ms://AI-ModelScope/LaTeX_OCR", data_slice=range(4)))
dataset.set_template("Qwen3_5Template", model_id=f"ms://{base_model}", max_length=512)
dataset.map(LatexOCR)
dataset.encode(batched=True)
first = dataset[0]
# The image is not dropped: it is encoded as pixel patches, with its placeholder tokens in the ids.
assert first["pixel_values"] is not None and len(first["pixel_values"]) > 0
assert first["image_grid_thw"] is not None

model = MultiLoraTransformersModel(model_id=f"ms://{base_model}")
model.add_adapter_to_model("vl", LoraConfig(target_modules="all-linear", r=8, lora_alpha=32))
model.set_template("Qwen3_5Template")
model.set_processor("InputProcessor", padding_side="right")
model.set_loss("CrossEntropyLoss")
model.set_optimizer("Adam", lr=1e-3)
losses = []
for epoch in range(3):
    for batch in DataLoader(dataset=dataset, batch_size=2):
        out = model.forward_backward(inputs=batch)
        assert math.isfinite(out["loss"]) and out["num_tokens"] > 0
        losses.append(out["loss"])
        model.clip_grad_and_step()
    logger.info(f"epoch {epoch}: {model.calculate_metric(is_training=True)}")
assert losses[-1] < losses[0], losses
path = model.save(name="vl-final")
logger.info(
    f"multimodal conformance passed: loss {losses[0]:.3f} -> {losses[-1]:.3f}, saved {path}"
)
