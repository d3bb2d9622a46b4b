"""The seed's full training example (server_and_client, "完整训练示例"), run locally.

Only the imports (`twinkle` instead of `twinkle_client`), the model id and the data set differ
from the seed: `tiny://qwen3.5` and the shipped `builtin://self-cognition` work offline.
"""

from peft import LoraConfig

from twinkle import get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import MultiLoraTransformersModel

logger = get_logger()

base_model = "tiny://qwen3.5"  # the seed: 'ms://Qwen/Qwen3.5-4B'
resume_path = None  # e.g. 'output/default/twinkle-epoch-0'

# Step 3: the data set
dataset = Dataset(dataset_meta=DatasetMeta("builtin://self-cognition", data_slice=range(500)))
dataset.set_template("Qwen3_5Template", model_id=base_model, max_length=512)
dataset.map(
    "SelfCognitionProcessor",
    init_args={"model_name": "twinkle模型", "model_author": "ModelScope社区"},
)
dataset.encode(batched=True)
dataloader = DataLoader(dataset=dataset, batch_size=4)

# Step 4: the model
model = MultiLoraTransformersModel(model_id=base_model)
lora_config = LoraConfig(target_modules="all-linear")
model.add_adapter_to_model("default", lora_config, gradient_accumulation_steps=2)
model.set_template("Qwen3_5Template")
model.set_processor("InputProcessor", padding_side="right")
model.set_loss("CrossEntropyLoss")
model.set_optimizer("Adam", lr=1e-3)  # the seed uses 1e-4 on a pretrained 4B model
# model.set_lr_scheduler('LinearLR')

# Step 5: resume (optional)
start_step = 0
if resume_path:
    logger.info(f"Resuming from checkpoint {resume_path}")
    progress = model.resume_from_checkpoint(resume_path)
    dataloader.resume_from_checkpoint(progress["consumed_train_samples"])
    start_step = progress["cur_step"]

# Step 6: the training loop
logger.info(model.get_train_configs().model_dump())
for epoch in range(3):
    logger.info(f"Starting epoch {epoch}")
    for cur_step, batch in enumerate(dataloader, start=start_step + 1):
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
        if cur_step % 2 == 0:
            metric = model.calculate_metric(is_training=True)
            logger.info(f"Current is step {cur_step} of {len(dataloader)}, metric: {metric.result}")
    # Step 7: save a checkpoint
    twinkle_path = model.save(
        name=f"twinkle-epoch-{epoch}",
        save_optimizer=True,
        consumed_train_samples=dataloader.get_state()["consumed_train_samples"],
    )
    logger.info(f"Saved checkpoint: {twinkle_path}")
